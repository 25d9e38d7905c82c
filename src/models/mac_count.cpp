#include "models/mac_count.h"

#include "models/network.h"

#include <torch/torch.h>

namespace convnets {
namespace {

struct MacTrace {
  int64_t macs = 0;
};
thread_local MacTrace* active_trace = nullptr;

}  // namespace

bool counting_macs() { return active_trace != nullptr; }

void add_macs(int64_t macs) {
  if (active_trace) active_trace->macs += macs;
}

int64_t count_macs(NetworkImpl& net, int input_size, int in_channels) {
  // Restores the module's mode and ends the trace even if forward throws.
  struct TraceScope {
    NetworkImpl& net;
    bool was_training;
    MacTrace trace;
    explicit TraceScope(NetworkImpl& n) : net(n), was_training(n.is_training()) {
      net.eval();
      active_trace = &trace;
    }
    ~TraceScope() {
      active_trace = nullptr;
      net.train(was_training);
    }
  } scope(net);
  torch::NoGradGuard no_grad;
  net.forward(torch::zeros({1, in_channels, input_size, input_size}));
  return scope.trace.macs;
}

int64_t count_parameters(const torch::nn::Module& module) {
  int64_t n = 0;
  for (const auto& p : module.parameters()) n += p.numel();
  return n;
}

}  // namespace convnets
