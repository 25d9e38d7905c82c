#include "runtime/fusion_setup.h"

#include "models/cudnn_graphs.h"
#include "models/layers.h"
#include "runtime/block_timer.h"

#include <optional>

namespace convnets::runtime {

namespace {

models::FusedBnContext fusion_context(const Runtime& rt, models::FusionMode mode) {
  models::FusedBnContext c;
  c.mode = mode;
  c.cuda = rt.device.is_cuda();
  c.dtype = rt.autocast;
  c.channels_last = rt.channels_last;
  // cuDNN is asked only where everything else allows the fusion: a CPU or fp32 run never touches it.
  if (models::fused_bn_refusal(c, models::BnFusion::Relu, 4, false).empty()) {
    c.cudnn_refusal = models::cudnn_fused_bn_refusal(c.dtype);
  }
  return c;
}

std::string describe(NetworkImpl& model, const models::FusedBnContext& c) {
  auto out = models::describe_fused_bn_plan(models::fused_bn_plan(model, c));
  if (const auto blocks = models::describe_block_paths(model, c); !blocks.empty()) out += "; " + blocks;
  if (const auto unfused = models::norm_conv::backward_fallbacks(); !unfused.empty()) {
    out += "; unfused where cuDNN has no engine: " + unfused;
  }
  return out;
}

}  // namespace

std::string set_fusion(NetworkImpl& model, const Runtime& rt, models::FusionMode mode) {
  models::install_fused_bn_backend(&models::cudnn_fused_bn_backend());
  const auto c = fusion_context(rt, mode);
  models::set_fused_batchnorm(model, mode != models::FusionMode::None);
  models::set_default_paths(model, c);
  return describe(model, c);
}

std::string describe_fusion(NetworkImpl& model, const Runtime& rt, models::FusionMode mode) {
  return describe(model, fusion_context(rt, mode));
}

TuneReport tune_fusion(NetworkImpl& model, const Runtime& rt, models::FusionMode mode,
                       const std::vector<std::int64_t>& sizes, const std::string& cache_flag) {
  TuneReport report;
  report.mode = mode;
  if (!rt.device.is_cuda() || models::tunable_blocks(model).empty()) return report;
  record_block_inputs(model, rt, sizes);
  const auto c = fusion_context(rt, mode);
  std::optional<TuningCache> cache;
  const std::string path = cache_flag.empty() ? default_tuning_cache() : cache_flag == "none" ? "" : cache_flag;
  if (!path.empty()) cache.emplace(path, tuning_device(rt));
  DeviceBlockTimer timer(rt.channels_last);
  report = tune(model, c, timer, cache ? &*cache : nullptr);
  if (cache && report.timed > 0 && !cache->save()) report.cache_note += (report.cache_note.empty() ? "" : "; ") + cache->note();
  return report;
}

}  // namespace convnets::runtime
