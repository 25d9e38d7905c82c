// Run logs in NVIDIA DLLogger's JSON-stream format ("DLLL {...}" lines), which DLE's tooling parses.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>
#include <utility>

namespace convnets::train {

// An exclusive flock(2) on a run's log, held by the process that writes it;
// the kernel drops it when that process ends, however it ends. It is how a
// second writer is refused and how being_written() sees a live run.
class LogLock {
 public:
  LogLock() = default;
  // Locks `path`, creating it when `create` (else an absent file gives an
  // empty lock). Throws Error naming the path when another process holds it.
  static LogLock take(const std::string& path, bool create);
  LogLock(LogLock&& other) noexcept : fd_(std::exchange(other.fd_, -1)), held_(std::exchange(other.held_, false)) {}
  LogLock& operator=(LogLock&& other) noexcept;
  ~LogLock();
  int fd() const { return fd_; }
  // False where the file system has no flock (then nothing is refused).
  bool held() const { return held_; }

 private:
  int fd_ = -1;
  bool held_ = false;
};

// Mirrors dllogger.JSONStreamBackend: each line is "DLLL " + a JSON object
// with timestamp (string, seconds since the epoch), datetime, elapsedtime
// (string seconds), type ("LOG" | "METADATA") and either step + data or
// metric + metadata. Steps as DLE logs them: "PARAMETER" for the config,
// [epoch, iteration] per step, [epoch] per epoch, [] for the run summary.
class DlLogger {
 public:
  // Appends when `append` (a resumed run), after dropping a last line that an
  // interrupted write left unfinished; else truncates. Throws Error naming the path.
  // While it lives the logger holds the log's LogLock: `lock` when the
  // caller took it earlier (a resumed run, from its start), else its own.
  // Throws Error when another process holds it.
  DlLogger(const std::string& path, bool append, LogLock lock = {});
  // Whether the lock is held: written into the PARAMETER record so that
  // report --watch trusts an unlocked log to mean a stopped run only then.
  bool locked() const { return lock_.held(); }
  DlLogger(const DlLogger&) = delete;
  DlLogger& operator=(const DlLogger&) = delete;
  void metadata(const std::string& metric, const nlohmann::json& metadata);
  void log(const nlohmann::json& step, const nlohmann::json& data);

 private:
  void write(nlohmann::ordered_json record);
  std::string path_;
  std::ofstream out_;
  std::chrono::steady_clock::time_point start_;
  LogLock lock_;
};

// Whether a live process has `path` open as its DlLogger: how `report --watch`
// tells a run that is still going from one killed before its summary. No
// answer where the file cannot be opened or its file system has no flock.
std::optional<bool> being_written(const std::string& path);

}  // namespace convnets::train
