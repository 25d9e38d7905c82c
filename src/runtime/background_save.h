// Checkpoints written off the training thread: the state copied to host memory between two steps, then written,
// fsynced and renamed by a thread of its own (torch.distributed.checkpoint.async_save's division of the work).
#pragma once

#include "io/safetensors.h"

#include <nlohmann/json.hpp>

#include <atomic>
#include <chrono>
#include <exception>
#include <string>
#include <thread>

namespace convnets::runtime {

// What a save() held its caller for.
struct SnapshotTiming {
  double waited_s = 0;    // for the previous write, still running when this save came
  double snapshot_s = 0;  // copying the state to the host buffers
  bool waited() const { return waited_s > 0; }
};

// One write in flight at most: the host buffers a snapshot fills are those the write reads, so a save that finds
// the previous write running waits for it (and its timing says so). Buffers are kept from one save to the next,
// pinned where the state is on a CUDA device so the copies run at the bus's speed.
class BackgroundSaver {
 public:
  BackgroundSaver() = default;
  // Waits for the write in flight; a failure nobody collected is printed (a destructor cannot throw it).
  ~BackgroundSaver();
  BackgroundSaver(const BackgroundSaver&) = delete;
  BackgroundSaver& operator=(const BackgroundSaver&) = delete;

  // Rethrows a failure of the previous write, waits for it, copies `tensors` (the caller's live state, which it
  // may change as soon as this returns) and starts writing them with `meta` as runtime::save_checkpoint does.
  SnapshotTiming save(const std::string& path, const NamedTensors& tensors, nlohmann::json meta);
  // Blocks until no write is in flight; rethrows the failure of the last one (Error naming its file).
  void wait();
  // A write started and not yet renamed into place.
  bool writing() const { return worker_.joinable() && !done_.load(); }
  // The last write's seconds, from its start to its rename (0 before one finished); read it after wait().
  double last_write_s() const { return last_write_s_; }

 private:
  void snapshot(const NamedTensors& tensors);

  NamedTensors buffers_;
  std::thread worker_;
  std::exception_ptr failure_;
  std::atomic<bool> done_{false};
  double last_write_s_ = 0;
};

}  // namespace convnets::runtime
