// OpenVINO's CPU runtime as a convnets engine: the exporter's ONNX graph, read from memory and compiled for the CPU.
#include "deploy/engine.h"

#include "core/cpu_features.h"
#include "core/error.h"
#include "data/loader.h"
#include "export/onnx_export.h"

#include <ATen/Parallel.h>
#include <ATen/core/Tensor.h>
#include <ATen/ops/empty.h>
#include <openvino/openvino.hpp>

#include <algorithm>
#include <cctype>
#include <exception>
#include <mutex>
#include <vector>

namespace convnets::deploy {
namespace {

class OpenVinoEngine final : public Engine {
 public:
  explicit OpenVinoEngine(EngineSpec spec) : s_(std::move(spec)) {
    const auto& precision = s_.rt.precision;
    if (precision != "fp32" && precision != "bf16") {
      throw Error("--engine openvino: --precision " + precision + " is a GPU mode; the OpenVINO engine runs fp32 "
                  "or bf16 on the CPU (INT8 networks run as INT8 in either)",
                  "use --precision fp32 or bf16");
    }
    if (precision == "bf16") require_cpu_bf16("--engine openvino --precision");
    // The graph the exporter writes: BN folded (OpenVINO would fuse it
    // anyway), dynamic batch, and for a quantized network the QDQ graph of
    // its plan, which OpenVINO's low-precision passes turn into INT8 kernels.
    std::string bytes = std::move(s_.onnx);
    if (bytes.empty()) {
      OnnxOptions o;
      o.image_size = s_.pre.input_size;
      o.num_classes = s_.num_classes;
      o.dynamic_batch = true;
      o.fold_bn = true;
      o.int8 = s_.int8;
      o.metadata = {{"producer", "convnets engine"}};
      s_.model->eval();
      bytes = onnx_model_bytes(*s_.model, o);
    }
    try {
      auto model = core_.read_model(bytes, ov::Tensor());
      // Any batch (a file exported with a fixed one too), and float32 in and
      // out whatever the graph's dtype (an fp16 export converts inside).
      const auto side = static_cast<std::int64_t>(s_.pre.input_size);
      model->reshape(ov::PartialShape{-1, 3, side, side});
      ov::preprocess::PrePostProcessor ppp(model);
      ppp.input().tensor().set_element_type(ov::element::f32);
      ppp.output().tensor().set_element_type(ov::element::f32);
      model = ppp.build();
      model_ = model;
      compiled_ = compile(ov::hint::PerformanceMode::LATENCY);
      request_ = compiled_.create_infer_request();
      kernel_precisions_ = count_kernel_precisions();
    } catch (const ov::Exception& e) {
      throw Error("--engine openvino could not compile " + s_.arch + " for the CPU: " + first_line(e.what()),
                  "use --engine torch for this network, or report the layer above");
    }
  }

  std::string name() const override { return "openvino"; }

  std::map<std::string, std::int64_t> kernel_precisions() const override { return kernel_precisions_; }

  at::Tensor input(const at::Tensor& pixels) const override {
    // NCHW float, the graph's input, on this thread: LibTorch's parallel
    // normalisation would leave its pool spinning on OpenVINO's cores
    // (ResNet-50 batch 1 on 2 cores: 45 img/s, 55 with the pool asleep).
    return data::normalize_batch_serial(pixels, s_.pre.mean, s_.pre.std);
  }

  at::Tensor logits_of_input(const at::Tensor& input) const override {
    return run(input.to(c10::kCPU, at::kFloat).contiguous());
  }

 private:
  // Read once, after compiling: the CPU plugin's execution graph, each node's
  // layer type and the precision its primitive was chosen for, under
  // ov::exec_model_info's rt_info keys (spelled out: the wheel does not ship
  // that header). The throughput build compiles the same graph with the same
  // precision hint, so its kernels are these.
  std::map<std::string, std::int64_t> count_kernel_precisions() const {
    std::map<std::string, std::int64_t> counts;
    for (const auto& op : compiled_.get_runtime_model()->get_ordered_ops()) {
      const auto& info = op->get_rt_info();
      const auto type = info.find("layerType");
      const auto precision = info.find("runtimePrecision");
      if (type == info.end() || precision == info.end()) continue;
      const auto layer = type->second.as<std::string>();
      if (layer.find("Convolution") == std::string::npos && layer != "FullyConnected" && layer != "MatMul") continue;
      auto name = precision->second.as<std::string>();
      std::transform(name.begin(), name.end(), name.begin(), [](unsigned char c) { return std::tolower(c); });
      ++counts[name];
    }
    return counts;
  }

  static std::string first_line(const std::string& s) {
    const auto end = s.find('\n');
    return end == std::string::npos ? s : s.substr(0, end);
  }

  at::Tensor run(const at::Tensor& x) const {
    const auto side = s_.pre.input_size;
    if (x.dim() != 4 || x.size(1) != 3 || x.size(2) != side || x.size(3) != side) {
      throw Error("--engine openvino: the graph was compiled for [B, 3, " + std::to_string(side) + ", " +
                  std::to_string(side) + "] input, got " + c10::str(x.sizes()));
    }
    const std::int64_t batch = x.size(0);
    at::Tensor out = at::empty({batch, s_.num_classes}, at::TensorOptions().dtype(at::kFloat));
    // One caller at a time (another Python thread waits): the requests are the engine's.
    std::lock_guard<std::mutex> lock(mutex_);
    try {
      if (on_streams(batch)) {
        infer_on_streams(x, out);
      } else {
        bind(request_, x, out, 0, batch);
        request_.infer();
      }
    } catch (const ov::Exception& e) {
      throw Error("--engine openvino: inference failed: " + first_line(e.what()));
    }
    return out;
  }

  static std::int64_t parts_of(std::int64_t batch) { return (batch + kStreamImages - 1) / kStreamImages; }

  // Whether a batch runs on the throughput build: requests of kStreamImages
  // images queued on its streams (one thread each on 2 cores), so no thread
  // waits for another inside a layer. Probed on 2 cores, batch 16:
  // 1.03-1.08x the single request in fp32/bf16 and GPUNet-0 INT8, 0.97x
  // ResNet-50 INT8 (docs/PERFORMANCE.md, issue 35). A batch with fewer parts
  // than streams (a small batch on many cores) stays on the latency build,
  // whose one request uses every thread.
  bool on_streams(std::int64_t batch) const {
    if (batch < kStreamsFromBatch || at::get_num_threads() < 2) return false;
    if (!throughput_) {
      auto compiled = compile(ov::hint::PerformanceMode::THROUGHPUT);
      // Two requests per stream keep each stream fed while the other is
      // rebound; a fixed pool, not one per part (each holds its own
      // activation memory: a 500-image batch would hold 250).
      const int streams = std::max(1, static_cast<int>(compiled.get_property(ov::num_streams)));
      std::vector<ov::InferRequest> pool;
      for (int i = 0; i < 2 * streams; ++i) pool.push_back(compiled.create_infer_request());
      pool_ = std::move(pool);  // both or neither: a half-made pool is never kept
      throughput_ = std::move(compiled);
    }
    return 2 * parts_of(batch) >= static_cast<std::int64_t>(pool_.size());
  }

  void infer_on_streams(const at::Tensor& x, at::Tensor& out) const {
    const std::int64_t batch = x.size(0), parts = parts_of(batch);
    const auto slots = static_cast<std::int64_t>(pool_.size());
    std::int64_t started = 0;
    // Waits for every request still in flight, then rethrows the first
    // failure: none may read `x` or write into `out` once this returns or
    // throws (a finished request returns at once).
    auto drain = [&] {
      std::exception_ptr first;
      for (std::int64_t i = std::max<std::int64_t>(0, started - slots); i < started; ++i) {
        try {
          pool_[i % slots].wait();
        } catch (...) {
          if (!first) first = std::current_exception();
        }
      }
      if (first) std::rethrow_exception(first);
    };
    try {
      for (std::int64_t i = 0; i < parts; ++i) {
        auto& r = pool_[i % slots];
        if (i >= slots) r.wait();  // its previous part is done before it is rebound
        const std::int64_t begin = i * kStreamImages;
        bind(r, x, out, begin, std::min(batch, begin + kStreamImages));
        r.start_async();
        ++started;
      }
    } catch (...) {
      try {
        drain();
      } catch (...) {  // the failure that stopped the loop is the one to report
      }
      throw;
    }
    drain();
  }

  // Rows [begin, end) of `x` in, the same rows of `out` out, both borrowed
  // (OpenVINO only reads the input).
  void bind(ov::InferRequest& request, const at::Tensor& x, at::Tensor& out, std::int64_t begin,
            std::int64_t end) const {
    const auto side = static_cast<std::size_t>(s_.pre.input_size);
    const auto rows = static_cast<std::size_t>(end - begin);
    request.set_input_tensor(ov::Tensor(ov::element::f32, ov::Shape{rows, 3, side, side},
                                        const_cast<float*>(x.data_ptr<float>()) + begin * 3 * side * side));
    request.set_output_tensor(ov::Tensor(ov::element::f32, ov::Shape{rows, std::size_t(s_.num_classes)},
                                         out.data_ptr<float>() + begin * s_.num_classes));
  }

  ov::CompiledModel compile(ov::hint::PerformanceMode mode) const {
    // The precision is pinned, never left to the plugin: on a CPU with
    // native bf16 OpenVINO would otherwise run an "fp32" request in bf16.
    const bool bf16 = s_.rt.precision == "bf16";
    return core_.compile_model(model_, "CPU", ov::hint::inference_precision(bf16 ? ov::element::bf16 : ov::element::f32),
                               ov::hint::performance_mode(mode),
                               ov::inference_num_threads(static_cast<std::int32_t>(at::get_num_threads())));
  }

  // From this batch size on, a batch runs on the throughput build (compiled
  // on first use, so batch-1 callers never pay for it), in requests of
  // kStreamImages: 2 measured fastest at batch 16 (1 image per request 2-6 %
  // slower, 4 or 8 between).
  static constexpr std::int64_t kStreamsFromBatch = 4;
  static constexpr std::int64_t kStreamImages = 2;

  EngineSpec s_;
  mutable ov::Core core_;
  std::shared_ptr<ov::Model> model_;
  std::map<std::string, std::int64_t> kernel_precisions_;
  ov::CompiledModel compiled_;  // latency: one stream over all threads
  mutable ov::InferRequest request_;
  mutable ov::CompiledModel throughput_;  // streams, for batches (empty until one comes)
  mutable std::vector<ov::InferRequest> pool_;
  mutable std::mutex mutex_;
};

}  // namespace

bool openvino_available() { return true; }

std::string openvino_version() {
  // "2026.4.1-22982-e213a147257-releases/2026/4": the release is enough.
  const std::string build = ov::get_openvino_version().buildNumber;
  return build.substr(0, build.find('-'));
}

std::unique_ptr<Engine> make_openvino_engine(EngineSpec spec) { return std::make_unique<OpenVinoEngine>(std::move(spec)); }

}  // namespace convnets::deploy
