// Run logs in NVIDIA DLLogger's JSON-stream format ("DLLL {...}" lines), which DLE's tooling parses.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
#include <optional>
#include <string>

namespace convnets::train {

// Mirrors dllogger.JSONStreamBackend: each line is "DLLL " + a JSON object
// with timestamp (string, seconds since the epoch), datetime, elapsedtime
// (string seconds), type ("LOG" | "METADATA") and either step + data or
// metric + metadata. Steps as DLE logs them: "PARAMETER" for the config,
// [epoch, iteration] per step, [epoch] per epoch, [] for the run summary.
class DlLogger {
 public:
  // Appends when `append` (a resumed run), after dropping a last line that an
  // interrupted write left unfinished; else truncates. Throws Error naming the path.
  // While it lives the logger holds an exclusive flock(2) on the log, which
  // the kernel drops when the process ends, however it ends: see
  // being_written(). Throws Error when another process holds it.
  DlLogger(const std::string& path, bool append);
  ~DlLogger();
  DlLogger(const DlLogger&) = delete;
  DlLogger& operator=(const DlLogger&) = delete;
  void metadata(const std::string& metric, const nlohmann::json& metadata);
  void log(const nlohmann::json& step, const nlohmann::json& data);

 private:
  void write(nlohmann::ordered_json record);
  std::string path_;
  std::ofstream out_;
  std::chrono::steady_clock::time_point start_;
  int lock_fd_ = -1;
};

// Whether a live process has `path` open as its DlLogger: how `report --watch`
// tells a run that is still going from one killed before its summary. No
// answer where the file cannot be opened or its file system has no flock.
std::optional<bool> being_written(const std::string& path);

}  // namespace convnets::train
