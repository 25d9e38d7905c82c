// The c10d collective backends of a data-parallel run (Gloo, NCCL), created over the job's rendezvous store.
#pragma once

#include <torch/csrc/distributed/c10d/Backend.hpp>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <c10/core/Device.h>

#include <chrono>

namespace convnets::distributed {

// Each factory lives in a file of its own: the process-group headers pull in
// their library's headers (gloo/*.h, nccl.h), which no other file needs.
// Both return c10d's common interface, so the gradient buckets, SyncBN and
// the BN broadcast go through the same code whichever backend runs them.

// Gloo over TCP; `loopback`: every rank is on this machine, so bind to
// 127.0.0.1 whatever the host name resolves to (GLOO_SOCKET_IFNAME wins).
c10::intrusive_ptr<c10d::Backend> make_gloo_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout, bool loopback);

// NCCL on `device` (a CUDA device this process has selected). Collectives
// block the calling thread until done or `timeout`, so a lost rank surfaces
// as an exception the group can diagnose rather than a killed process.
c10::intrusive_ptr<c10d::Backend> make_nccl_backend(const c10::intrusive_ptr<c10d::Store>& store, int rank,
                                                    int world_size, std::chrono::milliseconds timeout,
                                                    const c10::Device& device);

}  // namespace convnets::distributed
