// Where and how tensors run: device, mixed-precision mode and memory format, checked against what the device supports.
#pragma once

#include "models/network.h"
#include "models/registry.h"

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::data {
struct Batch;
}

namespace convnets::runtime {

struct Runtime {
  c10::Device device = c10::kCPU;
  std::string precision = "fp32";
  c10::ScalarType autocast = c10::kFloat;  // kHalf (amp) / kBFloat16 (bf16); kFloat: none
  bool loss_scaling = false;               // amp: dynamic loss scaling
  bool channels_last = true;
};

// Throws Error naming --device/--precision when the device lacks the mode
// (fp16 and tf32 need CUDA; bf16 needs compute capability 8.0+ on a GPU, and
// native bf16 instructions on the CPU, see core/cpu_features.h).
// Sets the TF32 switches: on for tf32, off for fp32 (PyTorch leaves cuDNN's on).
// `cuda_index`: the GPU of this process (a data-parallel worker's local rank).
Runtime resolve_runtime(const std::string& device, const std::string& precision, const std::string& memory_format,
                        int cuda_index = 0);

// The same checks of --device and --precision, touching no GPU: a launcher
// refuses a mode the machine lacks once, before it starts its workers.
void check_runtime(const std::string& device, const std::string& precision);

// Moves the model to the device and, for channels-last, its 4-D weights to NHWC memory.
void prepare_model(NetworkImpl& model, const Runtime& rt);

// A loader batch (uint8 NHWC on the host) as the network's input on the
// device: normalised in one pass, in the autocast dtype (fp16/bf16 input
// saves the first layer's cast, as DLE's DALI pipeline does under --amp) and
// the run's memory format.
at::Tensor network_input(const at::Tensor& images, const Preprocessing& pre, const Runtime& rt);

// Either kind of loader batch as the network's input: pixels through
// network_input, or an encoded batch (--data-backend gpu) through the device
// decoder, which writes the same normalised channels-last tensor.
at::Tensor batch_input(const data::Batch& batch, const Preprocessing& pre, const Runtime& rt);

// --data-backend: auto (cpu: the device path is not yet measured faster), cpu
// or gpu (hybrid decoding; needs a CUDA device); the error names the flag.
bool use_device_decode(const std::string& backend, const Runtime& rt);

}  // namespace convnets::runtime
