// The inference engines `classify`, `eval`, `bench infer` and the Python package run a network on: LibTorch itself, or OpenVINO's CPU runtime fed the ONNX graph convnets' exporter writes, in memory.
#pragma once

#include "models/network.h"
#include "models/registry.h"
#include "quant/qdq.h"
#include "runtime/runtime.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace convnets::deploy {

// The --engine flag's help, one text for classify, eval and bench infer.
inline constexpr const char* kEngineHelp =
    "auto | torch | openvino (auto: OpenVINO on the CPU where this build has it, LibTorch on CUDA)";

// Whether this build links OpenVINO's runtime (found in .venv's openvino
// wheel at configure time), and its version ("" without it).
bool openvino_available();
std::string openvino_version();

// The engines this build can run: "torch", and "openvino" where available.
std::vector<std::string> engine_names();

// `engine` (torch, openvino or auto; `flag` names it in errors) for this
// runtime. auto is the engine measured fastest for the device and precision
// (docs/PERFORMANCE.md, "CPU inference"): OpenVINO on the CPU in
// every precision where the build has it, LibTorch on CUDA. An explicit
// openvino on a CUDA runtime or in a build without it is an Error saying so.
std::string resolve_engine(const std::string& engine, const runtime::Runtime& rt);

// What an engine runs: a network in eval mode (BN folded or not), its
// INT8 plan when it is a quantized network (the torch engine runs the
// fake-quantized wrapper, the OpenVINO engine the QDQ graph of the plan),
// and its input.
struct EngineSpec {
  std::string arch;  // for messages
  Network model;
  // Instead of `model`: an ONNX graph's bytes (an exported file; OpenVINO only).
  std::string onnx;
  const quant::Plan* int8 = nullptr;
  Preprocessing pre;
  std::int64_t num_classes = 0;
  runtime::Runtime rt;
};

class Engine {
 public:
  virtual ~Engine() = default;
  virtual std::string name() const = 0;
  // A uint8 [B, H, W, 1|3] batch normalised with the preprocessing's mean and
  // std into the engine's input (device, dtype and layout).
  virtual at::Tensor input(const at::Tensor& pixels) const = 0;
  // Float32 logits (on the runtime's device) of a float [B, 3, H, W] batch
  // already normalised, in any dtype or layout (converted when not the engine's).
  virtual at::Tensor logits_of_input(const at::Tensor& input) const = 0;
  at::Tensor logits(const at::Tensor& pixels) const { return logits_of_input(input(pixels)); }
  // How many of the compiled network's convolutions and fully connected
  // layers run in each precision ("u8", "i8", "bf16", "f32"), as the runtime
  // itself reports it after compiling: evidence that an INT8 or bf16 request
  // ran as such, not a restatement of the request. Empty where the engine does
  // not report it (LibTorch runs what the network's dtypes say).
  virtual std::map<std::string, std::int64_t> kernel_precisions() const { return {}; }
};

// `name` is a resolved engine (resolve_engine). The OpenVINO engine compiles
// the graph for the CPU here (a second or so for ResNet-50): an op or a
// precision it cannot run is an Error naming the engine and the layer.
std::unique_ptr<Engine> make_engine(const std::string& name, EngineSpec spec);

// The OpenVINO engine's constructor (engine_openvino.cpp, built with OpenVINO only).
std::unique_ptr<Engine> make_openvino_engine(EngineSpec spec);

}  // namespace convnets::deploy
