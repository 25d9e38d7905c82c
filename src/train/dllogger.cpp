#include "train/dllogger.h"

#include "core/error.h"

#include <ctime>

namespace convnets::train {

DlLogger::DlLogger(const std::string& path, bool append)
    : path_(path), out_(path, append ? std::ios::app : std::ios::trunc), start_(std::chrono::steady_clock::now()) {
  if (!out_) throw Error(system_error("cannot write the log", path));
}

void DlLogger::write(nlohmann::ordered_json record) {
  const auto now = std::chrono::system_clock::now();
  const auto us = std::chrono::duration_cast<std::chrono::microseconds>(now.time_since_epoch()).count();
  const std::time_t secs = static_cast<std::time_t>(us / 1000000);
  std::tm tm{};
  localtime_r(&secs, &tm);
  char date[64];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M:%S", &tm);
  char frac[16];
  std::snprintf(frac, sizeof frac, ".%06lld", static_cast<long long>(us % 1000000));
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  nlohmann::ordered_json line;
  line["timestamp"] = std::to_string(static_cast<double>(us) / 1e6);
  line["datetime"] = std::string(date) + frac;
  line["elapsedtime"] = std::to_string(elapsed);
  for (auto it = record.begin(); it != record.end(); ++it) line[it.key()] = it.value();
  out_ << "DLLL " << line.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace) << '\n';
  out_.flush();  // a killed run keeps every line written so far
  if (!out_) throw Error(system_error("cannot write the log", path_));
}

void DlLogger::metadata(const std::string& metric, const nlohmann::json& metadata) {
  write({{"type", "METADATA"}, {"metric", metric}, {"metadata", metadata}});
}

void DlLogger::log(const nlohmann::json& step, const nlohmann::json& data) {
  write({{"type", "LOG"}, {"step", step}, {"data", data}});
}

}  // namespace convnets::train
