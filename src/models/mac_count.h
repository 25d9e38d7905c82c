// Counting a network's multiply-accumulates and parameters, and the trace its layers add their MACs to while it counts.
#pragma once

#include <cstdint>

namespace torch::nn {
class Module;
}

namespace convnets {

class NetworkImpl;

// Multiply-accumulates of conv and linear layers for one image at `input_size`
// (the convention of torchvision's and timm's published GMACs). The pass runs
// in shape-only mode: convolutions return zeros of the right shape instead of
// computing, so counting resnext101_32x8d takes milliseconds, not seconds.
int64_t count_macs(NetworkImpl& net, int input_size, int in_channels = 3);

int64_t count_parameters(const torch::nn::Module& module);

// Whether count_macs is counting on this thread (the layers then count instead of computing), and what a layer
// adds to it.
bool counting_macs();
void add_macs(int64_t macs);

}  // namespace convnets
