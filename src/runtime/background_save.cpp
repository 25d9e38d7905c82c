#include "runtime/background_save.h"

#include "runtime/checkpoint.h"

#include <torch/cuda.h>
#include <torch/torch.h>

#include <pthread.h>
#include <sched.h>

#include <iostream>

namespace convnets::runtime {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

bool same_layout(const NamedTensors& buffers, const NamedTensors& tensors) {
  if (buffers.size() != tensors.size()) return false;
  for (std::size_t i = 0; i < tensors.size(); ++i) {
    const auto& [name, t] = tensors[i];
    const auto& b = buffers[i];
    if (b.first != name || b.second.sizes() != t.sizes() || b.second.scalar_type() != t.scalar_type()) return false;
  }
  return true;
}

}  // namespace

BackgroundSaver::~BackgroundSaver() {
  try {
    wait();
  } catch (const std::exception& e) {
    std::cerr << "error: a checkpoint written in the background failed: " << e.what() << '\n';
  }
}

void BackgroundSaver::snapshot(const NamedTensors& tensors) {
  bool on_cuda = false;
  for (const auto& e : tensors) on_cuda = on_cuda || e.second.is_cuda();
  if (!same_layout(buffers_, tensors)) {
    // A new layout (the first save, or state that appeared since: ASP's masks, a loss scale): new buffers, kept.
    buffers_.clear();
    for (const auto& [name, t] : tensors) {
      buffers_.emplace_back(name, at::empty(t.sizes(), t.options().device(at::kCPU).pinned_memory(t.is_cuda())));
    }
  }
  // The step's kernels may run on a stream of their own (the CUDA graph's): all of them done before the copies,
  // which then go out together and are waited for once.
  if (on_cuda) torch::cuda::synchronize();
  for (std::size_t i = 0; i < tensors.size(); ++i) buffers_[i].second.copy_(tensors[i].second, /*non_blocking=*/on_cuda);
  if (on_cuda) torch::cuda::synchronize();
}

SnapshotTiming BackgroundSaver::save(const std::string& path, const NamedTensors& tensors, nlohmann::json meta) {
  SnapshotTiming timing;
  auto t0 = std::chrono::steady_clock::now();
  const bool busy = writing();
  wait();
  if (busy) timing.waited_s = std::max(seconds_since(t0), 1e-9);
  t0 = std::chrono::steady_clock::now();
  snapshot(tensors);
  timing.snapshot_s = seconds_since(t0);
  done_ = false;
  worker_ = std::thread([this, path, meta = std::move(meta)] {
    // The step's threads first: a parallel op waits for its slowest thread, so a writer that preempts one of them
    // for a moment costs the whole step that moment (measured: the step after a save at twice its time on two
    // cores). SCHED_IDLE runs the write on what the step leaves idle: all but the loader's cores on a GPU machine,
    // the gaps between ops on a CPU one.
    sched_param idle{};
    (void)pthread_setschedparam(pthread_self(), SCHED_IDLE, &idle);
    const auto start = std::chrono::steady_clock::now();
    try {
      save_checkpoint(path, buffers_, meta);
      last_write_s_ = seconds_since(start);
    } catch (...) {
      failure_ = std::current_exception();
    }
    done_ = true;
  });
  return timing;
}

void BackgroundSaver::wait() {
  if (worker_.joinable()) worker_.join();
  if (failure_) std::rethrow_exception(std::exchange(failure_, nullptr));
}

}  // namespace convnets::runtime
