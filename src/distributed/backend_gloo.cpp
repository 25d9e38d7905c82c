#include "distributed/backend.h"

// PyPI's torch wheel has Gloo compiled into libtorch_cpu but ships no gloo
// headers; these come from Debian's libgloo-dev, an older snapshot. That is
// sound for what this file does, and only for that: the gloo types it meets
// are held through shared_ptr (devices) or not at all; every gloo object is
// created, used and destroyed inside libtorch; ProcessGroupGloo's and
// Options' members are std containers of pointers, so their layout does not
// depend on gloo's; and GlooStore's newer store API is compiled out here
// (GLOO_STORE_HAS_STORE_V2 is torch's own build flag). Nothing of gloo is
// linked from Debian: every symbol resolves in libtorch_cpu.
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

namespace convnets::distributed {

c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout, bool loopback) {
  auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
  if (const char* ifname = std::getenv("GLOO_SOCKET_IFNAME")) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
  } else if (loopback) {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
  } else {
    opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
  }
  opts->threads = 2;
  return c10::make_intrusive<c10d::ProcessGroupGloo>(store, rank, world_size, opts);
}

}  // namespace convnets::distributed
