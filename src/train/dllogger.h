// Run logs in NVIDIA DLLogger's JSON-stream format ("DLLL {...}" lines), which DLE's tooling parses.
#pragma once

#include <nlohmann/json.hpp>

#include <chrono>
#include <fstream>
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
  DlLogger(const std::string& path, bool append);
  void metadata(const std::string& metric, const nlohmann::json& metadata);
  void log(const nlohmann::json& step, const nlohmann::json& data);

 private:
  void write(nlohmann::ordered_json record);
  std::string path_;
  std::ofstream out_;
  std::chrono::steady_clock::time_point start_;
};

}  // namespace convnets::train
