#include "models/fusion.h"

#include "core/error.h"

#include <torch/torch.h>

#include <algorithm>
#include <atomic>
#include <map>
#include <sstream>

namespace convnets::models {
namespace {

// "; not fused: 4 for REASON (first, ...); 1 for OTHER (name)": the refused entries grouped by reason, in the order
// each reason first appears.
std::string grouped_refusals(const std::vector<std::pair<std::string, std::string>>& refused_names,
                             const char* lead) {
  std::vector<std::pair<std::string, std::vector<std::string>>> groups;
  for (const auto& entry : refused_names) {
    const std::string& reason = entry.second;
    auto it = std::find_if(groups.begin(), groups.end(), [&](const auto& g) { return g.first == reason; });
    if (it == groups.end()) it = groups.insert(groups.end(), {reason, {}});
    it->second.push_back(entry.first);
  }
  std::ostringstream s;
  for (std::size_t i = 0; i < groups.size(); ++i) {
    const auto& [reason, names] = groups[i];
    s << (i == 0 ? lead : "; ") << names.size() << " for " << reason << " (" << names.front();
    if (names.size() > 1) s << ", " << (names.size() == 2 ? names[1] : "...");
    s << ")";
  }
  return s.str();
}

}  // namespace

namespace {
std::atomic<std::int64_t> bn_runs{0}, normconv_runs{0};
}  // namespace

FusedRuns fused_runs() { return {bn_runs.load(), normconv_runs.load()}; }

void reset_fused_runs() { bn_runs = 0, normconv_runs = 0; }

void note_fused_run(FusedRun what) { ++(what == FusedRun::Bn ? bn_runs : normconv_runs); }

std::string unverified(FusionPath path, at::ScalarType dtype) {
  (void)dtype;
  // Bn: Gpu.FusedResNet50StepMatchesTheUnfusedStep and the 200-step parity passed on the H100 of 2026-11-27. BnFold
  // is Bn's function with the same two gradients summed once in fp32 instead of rounded twice; the tuner's own
  // check compares it with the unfused path on every shape it times, and Gpu.FoldedBlocks* on the GPU.
  if (path != FusionPath::NormConv) return "";
  return "its 200-step run ended 13.8 % from the unfused one on the H100 of 2026-11-27 (bound 2 %; "
         "Gpu.FusedSmallResNetLearnsAsTheUnfusedOne)";
}

std::string fused_bn_refusal(const FusedBnContext& c, BnFusion fusion, std::int64_t channels, bool synchronized) {
  if (fusion == BnFusion::None) return "no ReLU after it";
  if (c.mode == FusionMode::None) return "--fusion none";
  if (!c.training) return "inference (BN is folded or runs as cuDNN's inference BN)";
  if (!c.cuda) return "not on CUDA";
  if (synchronized) return "synchronized BN (--sync-bn) keeps its own path";
  if (auto why = fused_bn_layout_refusal(c.dtype, c.channels_last, channels); !why.empty()) return why;
  if (!c.cudnn_refusal.empty()) return c.cudnn_refusal;
  return "";
}

std::string fused_bn_layout_refusal(at::ScalarType dtype, bool channels_last, std::int64_t channels) {
  if (!is_half_dtype(dtype)) {
    return std::string(dtype_name(dtype)) + " activations (the fused kernels take fp16 or bfloat16: --precision amp or bf16)";
  }
  if (!channels_last) return "NCHW activations (the fused kernels take NHWC: --memory-format nhwc)";
  if (channels % 4 != 0) return std::to_string(channels) + " channels (cuDNN's fused kernels need a multiple of 4)";
  return "";
}

std::vector<FusedBnLayer> fused_bn_plan(torch::nn::Module& module, const FusedBnContext& context) {
  std::vector<FusedBnLayer> plan;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    const auto* bn = dynamic_cast<const BatchNorm2dImpl*>(item.value().get());
    if (!bn) continue;
    FusedBnLayer l;
    l.name = item.key();
    l.fusion = bn->fusion();
    l.channels = bn->options.num_features();
    l.refusal = fused_bn_refusal(context, l.fusion, l.channels, bn->synchronized());
    plan.push_back(std::move(l));
  }
  return plan;
}

std::string describe_fused_bn_plan(const std::vector<FusedBnLayer>& plan) {
  int relu = 0, add_relu = 0;
  std::vector<std::pair<std::string, std::string>> refused;
  for (const auto& l : plan) {
    if (l.refusal.empty()) {
      (l.fusion == BnFusion::AddRelu ? add_relu : relu) += 1;
    } else {
      refused.emplace_back(l.name, l.refusal);
    }
  }
  std::ostringstream s;
  s << relu + add_relu << " of " << plan.size() << " BatchNorm layers fused (" << relu << " BN+ReLU, " << add_relu
    << " BN+add+ReLU)" << grouped_refusals(refused, "; not fused: ");
  return s.str();
}

int set_fused_batchnorm(torch::nn::Module& module, bool on) {
  int count = 0;
  for (auto& m : module.modules(/*include_self=*/true)) {
    if (auto* bn = dynamic_cast<BatchNorm2dImpl*>(m.get())) {
      bn->set_fused(on);
      if (bn->fusion() != BnFusion::None) ++count;
    }
  }
  return count;
}

std::vector<std::pair<std::string, FusionTunable*>> tunable_blocks(torch::nn::Module& module) {
  std::vector<std::pair<std::string, FusionTunable*>> out;
  for (const auto& item : module.named_modules("", /*include_self=*/true)) {
    if (auto* block = dynamic_cast<TunableModule*>(item.value().get())) out.emplace_back(item.key(), &block->tunable());
  }
  return out;
}

int set_default_paths(torch::nn::Module& module, const FusedBnContext& context) {
  // Without timing, Bn first: the fastest path measured (the H100 of 2026-11-27); Unfused last.
  static const FusionPath order[] = {FusionPath::Bn, FusionPath::BnFold, FusionPath::NormConv, FusionPath::Unfused};
  const auto admitted = admitted_paths(context.mode);
  int fused = 0;
  for (auto& [name, block] : tunable_blocks(module)) {
    FusionPath chosen = FusionPath::Unfused;
    for (const auto p : order) {
      if (std::find(admitted.begin(), admitted.end(), p) == admitted.end()) continue;
      if (context.mode == FusionMode::Auto && !unverified(p, context.dtype).empty()) continue;
      if (block->path_refusal(p, context).empty()) {
        chosen = p;
        break;
      }
    }
    block->set_path(chosen);
    if (chosen != FusionPath::Unfused) ++fused;
  }
  return fused;
}

at::Tensor block_paths(torch::nn::Module& module) {
  std::vector<std::int64_t> out;
  for (const auto& [name, block] : tunable_blocks(module)) out.push_back(static_cast<std::int64_t>(block->path()));
  return torch::tensor(out, torch::kLong);
}

void set_block_paths(torch::nn::Module& module, const at::Tensor& paths) {
  const auto blocks = tunable_blocks(module);
  const auto values = paths.to(torch::kCPU, torch::kLong).contiguous();
  if (values.numel() != static_cast<std::int64_t>(blocks.size())) {
    throw Error("set_block_paths: " + std::to_string(values.numel()) + " paths for " + std::to_string(blocks.size()) +
                " residual blocks");
  }
  const auto n = static_cast<std::int64_t>(all_fusion_paths().size());
  for (std::size_t i = 0; i < blocks.size(); ++i) {
    const auto v = values.data_ptr<std::int64_t>()[i];
    if (v < 0 || v >= n) throw Error("set_block_paths: " + std::to_string(v) + " is not a fusion path");
    blocks[i].second->set_path(static_cast<FusionPath>(v));
  }
}

std::string describe_block_paths(torch::nn::Module& module, const FusedBnContext& context) {
  const auto blocks = tunable_blocks(module);
  if (blocks.empty()) return "";
  std::map<FusionPath, int> counts;
  std::vector<std::pair<std::string, std::string>> unfused;
  for (const auto& [name, block] : blocks) {
    const auto p = block->path();
    if (p != FusionPath::Unfused) {
      ++counts[p];
      continue;
    }
    std::string why = context.mode == FusionMode::None ? "--fusion none" : block->path_refusal(FusionPath::Bn, context);
    if (why.empty()) why = "timed fastest unfused";
    unfused.emplace_back(name, why);
  }
  std::ostringstream s;
  const int fused = static_cast<int>(blocks.size() - unfused.size());
  s << fused << " of " << blocks.size() << " residual blocks fused";
  const char* sep = ": ";
  for (const auto p : all_fusion_paths()) {
    if (counts[p] == 0) continue;
    s << sep << counts[p] << " " << path_name(p);
    sep = ", ";
  }
  s << grouped_refusals(unfused, "; unfused: ");
  return s.str();
}

}  // namespace convnets::models
