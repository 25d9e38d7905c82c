#include "runtime/runtime.h"

#include "core/cpu_features.h"
#include "core/error.h"
#include "core/options.h"
#include "data/loader.h"

#include <ATen/Context.h>
#include <torch/cuda.h>
#include <torch/torch.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAFunctions.h>

namespace convnets::runtime {

namespace {

// Whether the run goes to a GPU; throws for a device or precision this machine lacks.
bool check_device_and_precision(const std::string& device, const std::string& precision) {
  // The CLI's parser checks these too; a library caller (the Python package) reaches here directly.
  options::check(options::device, device);
  options::check(options::precision, precision);
  const bool cuda = torch::cuda::is_available();
  if (device == "cuda" && !cuda) {
    throw Error(options::setting("device", "cuda") + ": no CUDA device is available",
                "check the driver and CUDA_VISIBLE_DEVICES");
  }
  const bool on_cuda = device == "cuda" || (device == "auto" && cuda);
  if (!on_cuda && precision == "bf16") {
    require_cpu_bf16(options::name("precision"));  // LibTorch's CPU autocast, as torch.autocast("cpu", torch.bfloat16)
  } else if (precision != "fp32" && !on_cuda) {
    throw Error(options::setting("precision", precision) + " needs a CUDA GPU, and this run is on the CPU",
                "use " + options::setting("precision", "fp32") +
                    " on the CPU (or bf16 where the CPU has AVX512_BF16 or AMX)");
  }
  return on_cuda;
}

}  // namespace

void check_runtime(const std::string& device, const std::string& precision) {
  check_device_and_precision(device, precision);
}

Runtime resolve_runtime(const std::string& device, const std::string& precision, const std::string& memory_format,
                        int cuda_index) {
  options::check(options::memory_format, memory_format);
  Runtime rt;
  const bool on_cuda = check_device_and_precision(device, precision);
  if (on_cuda && cuda_index >= static_cast<int>(torch::cuda::device_count())) {
    throw Error("local rank " + std::to_string(cuda_index) + " needs GPU " + std::to_string(cuda_index) + ", but " +
                    std::to_string(torch::cuda::device_count()) + " are visible",
                "one process per GPU: --nproc-per-node at most the GPU count (see CUDA_VISIBLE_DEVICES)");
  }
  rt.device = on_cuda ? c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(cuda_index)) : c10::Device(c10::kCPU);
  rt.precision = precision;
  rt.channels_last = memory_format == "nhwc";
  int major = 0;
  if (rt.device.is_cuda()) {
    c10::cuda::set_device(rt.device.index());  // kernels, cuDNN handles and graphs of this process go there
    major = at::cuda::getDeviceProperties(rt.device.index())->major;
  }
  if (rt.device.is_cuda() && (precision == "bf16" || precision == "tf32") && major < 8) {
    throw Error(options::setting("precision", precision) +
                    " needs a GPU of compute capability 8.0 or newer; this one is " + std::to_string(major) + ".x",
                "use " + options::setting("precision", "amp") + " (fp16) or fp32");
  }
  if (rt.device.is_cuda()) {
    at::globalContext().setAllowTF32CuBLAS(precision == "tf32");
    at::globalContext().setAllowTF32CuDNN(precision == "tf32");
    at::globalContext().setBenchmarkCuDNN(true);  // static shapes: autotune once
  }
  if (precision == "amp") {
    rt.autocast = c10::kHalf;
    rt.loss_scaling = true;
  } else if (precision == "bf16") {
    rt.autocast = c10::kBFloat16;
  }
  return rt;
}

void prepare_model(NetworkImpl& model, const Runtime& rt) {
  model.to(rt.device);
  if (!rt.channels_last) return;
  torch::NoGradGuard no_grad;
  for (auto& p : model.parameters()) {
    if (p.dim() == 4) p.set_data(p.contiguous(at::MemoryFormat::ChannelsLast));
  }
}

at::Tensor network_input(const at::Tensor& images, const Preprocessing& pre, const Runtime& rt) {
  return data::normalize_batch(images, pre.mean, pre.std, rt.device, rt.autocast,
                               rt.channels_last ? at::MemoryFormat::ChannelsLast : at::MemoryFormat::Contiguous);
}

at::Tensor batch_input(const data::Batch& batch, const Preprocessing& pre, const Runtime& rt) {
  if (!batch.encoded) return network_input(batch.images, pre, rt);
  const at::Tensor x = data::decode_on_device(*batch.encoded, rt.device, rt.autocast, pre.mean, pre.std);
  return rt.channels_last ? x : x.contiguous();
}

bool use_device_decode(const std::string& backend, const Runtime& rt) {
  if (backend == "auto" || backend == "cpu") return false;
  if (backend != "gpu") throw Error("--data-backend " + backend + ": expected auto, cpu or gpu");
  if (!rt.device.is_cuda())
    throw Error("--data-backend gpu: the device decoder runs on CUDA, and this run's device is " + rt.device.str(),
                "use --data-backend cpu, or --device cuda on a machine with a GPU");
  return true;
}

}  // namespace convnets::runtime
