#include "distributed/backend.h"

#include "core/error.h"

// nccl.h here is the nvidia-nccl wheel's that torch runs with (CMakeLists).
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>

#include <cstdlib>

namespace convnets::distributed {

c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout,
                                                    const c10::Device& device) {
  if (!device.is_cuda()) {
    throw Error("--dist-backend nccl: no CUDA device: NCCL moves CUDA tensors between GPUs, and this run is on the CPU",
                "use --dist-backend gloo (or auto) on the CPU");
  }
  // ProcessGroupNCCL reads these once, when it is created; a user's own
  // setting wins. Blocking wait makes a collective that times out throw in
  // this thread (Group::fail then names the rank at fault), and error
  // handling 2 aborts the communicators without killing the process, which
  // the default (3) would do from the watchdog before the diagnosis runs.
  ::setenv("TORCH_NCCL_BLOCKING_WAIT", "1", /*overwrite=*/0);
  ::setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "2", /*overwrite=*/0);
  auto opts = c10d::ProcessGroupNCCL::Options::create();
  opts->timeout = timeout;
  return c10::make_intrusive<c10d::ProcessGroupNCCL>(store, rank, world_size, opts);
}

}  // namespace convnets::distributed
