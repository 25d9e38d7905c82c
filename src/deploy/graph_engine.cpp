#include "deploy/graph_engine.h"

#include "core/error.h"
#include "core/options.h"
#include "models/layers.h"

#include <ATen/cuda/CUDAGraph.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/torch.h>

#include <algorithm>
#include <mutex>
#include <numeric>
#include <sstream>

namespace convnets::deploy {

GraphChoice choose_graph(const GraphPolicy& policy, const std::map<std::int64_t, double>& captured, std::int64_t rows) {
  double used = 0;
  for (const auto& [size, mb] : captured) used += mb;
  const bool room = used < policy.memory_mb;
  // The smallest captured graph that holds `rows`: padding it costs every call, a new capture once, so a new
  // capture is taken while memory allows and padding only after.
  auto padded = [&]() -> const std::pair<const std::int64_t, double>* {
    const auto it = captured.lower_bound(rows);
    return it == captured.end() ? nullptr : &*it;
  };
  auto full = [&] {
    std::ostringstream s;
    s << "the graphs hold " << static_cast<long long>(used) << " MiB of --graph-memory-mb "
      << static_cast<long long>(policy.memory_mb);
    return s.str();
  };
  if (!policy.sizes.empty()) {
    const auto it = std::lower_bound(policy.sizes.begin(), policy.sizes.end(), rows);
    if (it == policy.sizes.end()) {
      return {GraphChoice::How::Eager, 0,
              std::to_string(rows) + " rows: more than the largest of --graph-batch-sizes (" +
                  std::to_string(policy.sizes.back()) + ")"};
    }
    if (captured.count(*it)) return {GraphChoice::How::Replay, *it, ""};
    if (room) return {GraphChoice::How::Capture, *it, ""};
    if (const auto* p = padded()) return {GraphChoice::How::Replay, p->first, ""};
    return {GraphChoice::How::Eager, 0, full()};
  }
  if (captured.count(rows)) return {GraphChoice::How::Replay, rows, ""};
  if (room) return {GraphChoice::How::Capture, rows, ""};
  if (const auto* p = padded()) return {GraphChoice::How::Replay, p->first, ""};
  return {GraphChoice::How::Eager, 0, full()};
}

void check_graph_policy(const GraphPolicy& policy) {
  for (std::size_t i = 0; i < policy.sizes.size(); ++i) {
    if (policy.sizes[i] < 1 || (i > 0 && policy.sizes[i] <= policy.sizes[i - 1])) {
      throw Error(options::name("graph_batch_sizes") + ": expected ascending positive batch sizes without repeats");
    }
  }
  if (!(policy.memory_mb > 0)) {
    throw Error(options::name("graph_memory_mb") + " must be positive, got " + std::to_string(policy.memory_mb));
  }
}

std::vector<std::int64_t> parse_graph_sizes(const std::string& text) {
  std::vector<std::int64_t> sizes;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    std::size_t used = 0;
    long long v = 0;
    try {
      v = std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (item.empty() || used != item.size() || v < 1) {
      throw Error("--graph-batch-sizes " + text + ": expected positive batch sizes separated by commas, got '" + item +
                  "'");
    }
    if (!sizes.empty() && v <= sizes.back()) {
      throw Error("--graph-batch-sizes " + text + ": expected ascending sizes without repeats");
    }
    sizes.push_back(v);
  }
  if (sizes.empty()) throw Error("--graph-batch-sizes: expected at least one batch size");
  return sizes;
}

namespace {

double reserved_mib(c10::DeviceIndex device) {
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device);
  return static_cast<double>(stats.reserved_bytes[static_cast<std::size_t>(c10::CachingAllocator::StatType::AGGREGATE)]
                                 .current) /
         (1 << 20);
}

class GraphedEngine final : public Engine {
 public:
  GraphedEngine(EngineSpec spec, GraphPolicy policy) : s_(std::move(spec)), policy_(std::move(policy)) {
    if (!s_.rt.device.is_cuda()) throw Error("CUDA graphs: the engine's device is " + s_.rt.device.str());
    dtype_ = s_.rt.autocast == at::kFloat ? at::kFloat : s_.rt.autocast;
    s_.model->eval();
    // The weights in the pass's dtype once, rather than autocast casting each of them inside every graph.
    torch::NoGradGuard no_grad;
    for (auto& t : s_.model->parameters()) t.set_data(t.to(dtype_));
    for (auto& t : s_.model->buffers()) {
      if (t.is_floating_point()) t.set_data(t.to(dtype_));
    }
    models::install_fused_conv_backend(&models::cudnn_fused_conv_backend());
    models::set_fused_inference(*s_.model, policy_.fused_conv);
  }

  std::string name() const override { return "torch"; }

  at::Tensor input(const at::Tensor& pixels) const override { return runtime::network_input(pixels, s_.pre, s_.rt); }

  at::Tensor logits_of_input(const at::Tensor& x) const override {
    const auto format = s_.rt.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous;
    const auto in = x.to(s_.rt.device, dtype_, /*non_blocking=*/false, /*copy=*/false, format);
    // One batch at a time: each graph reads one static input and writes one static output.
    std::lock_guard<std::mutex> lock(mutex_);
    const auto choice = choose_graph(policy_, memory_, in.size(0));
    if (choice.how == GraphChoice::How::Eager) {
      eager_note_ = choice.why;
      return forward(in);
    }
    if (choice.how == GraphChoice::How::Capture) capture(choice.size, in);
    auto& g = graphs_.at(choice.size);
    const std::int64_t rows = in.size(0);
    g.input.narrow(0, 0, rows).copy_(in);
    if (rows < choice.size) padded_from_[choice.size] = rows;
    g.graph->replay();
    // A copy: the next replay overwrites the graph's output.
    return g.output.narrow(0, 0, rows).clone();
  }

  std::string describe() const {
    std::lock_guard<std::mutex> lock(mutex_);
    std::ostringstream s;
    s << "CUDA graphs:";
    if (graphs_.empty()) s << " none captured yet";
    bool first = true;
    for (const auto& [size, g] : graphs_) {
      s << (first ? " batch " : ", ") << size;
      if (auto it = padded_from_.find(size); it != padded_from_.end()) s << " (padded from " << it->second << ")";
      first = false;
    }
    double used = 0;
    for (const auto& [size, mb] : memory_) used += mb;
    s << "; " << static_cast<long long>(used + 0.5) << " MiB";
    if (!eager_note_.empty()) s << "; eager where " << eager_note_;
    if (const auto fused = models::describe_fused_convs(*s_.model); !fused.empty()) s << "; " << fused;
    return s.str();
  }

 private:
  struct Graph {
    at::Tensor input, output;
    std::unique_ptr<at::cuda::CUDAGraph> graph;
  };

  at::Tensor forward(const at::Tensor& in) const {
    torch::NoGradGuard no_grad;
    return s_.model->forward(in).to(at::kFloat);
  }

  // The pass on a zero batch of `size` rows, run twice eagerly (cuDNN's autotuning, lazy allocations) and then
  // recorded, on a side stream as CUDA graphs must be; its private memory is what the allocator reserved meanwhile.
  void capture(std::int64_t size, const at::Tensor& like) const {
    const c10::cuda::CUDAGuard device(like.device());
    auto sizes = like.sizes().vec();
    sizes[0] = size;
    Graph g;
    {
      // A tensor of its own, not an inference tensor: later calls may come from outside InferenceMode.
      c10::InferenceMode normal(false);
      g.input = at::zeros(sizes, like.options().memory_format(like.suggest_memory_format()));
    }
    const double before = reserved_mib(like.device().index());
    torch::cuda::synchronize();
    {
      auto side = c10::cuda::getStreamFromPool(false, like.device().index());
      c10::cuda::CUDAStreamGuard on_side(side);
      for (int i = 0; i < 2; ++i) forward(g.input);
      g.graph = std::make_unique<at::cuda::CUDAGraph>();
      // Thread-local: another thread's CUDA work (a loader, another engine) must not invalidate the capture.
      g.graph->capture_begin({0, 0}, cudaStreamCaptureModeThreadLocal);
      g.output = forward(g.input);
      g.graph->capture_end();
    }
    torch::cuda::synchronize();
    memory_[size] = std::max(0.0, reserved_mib(like.device().index()) - before);
    graphs_.emplace(size, std::move(g));
  }

  EngineSpec s_;
  GraphPolicy policy_;
  at::ScalarType dtype_ = at::kFloat;
  mutable std::mutex mutex_;
  mutable std::map<std::int64_t, Graph> graphs_;
  mutable std::map<std::int64_t, double> memory_;
  mutable std::map<std::int64_t, std::int64_t> padded_from_;
  mutable std::string eager_note_;
};

}  // namespace

std::unique_ptr<Engine> make_graphed_engine(EngineSpec spec, GraphPolicy policy) {
  return std::make_unique<GraphedEngine>(std::move(spec), std::move(policy));
}

std::string describe_graphs(const Engine& engine) {
  const auto* g = dynamic_cast<const GraphedEngine*>(&engine);
  return g ? g->describe() : "";
}

}  // namespace convnets::deploy
