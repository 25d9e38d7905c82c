#include "train/dllogger.h"

#include "core/error.h"
#include "core/json.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <iostream>

namespace convnets::train {

namespace {

// A record cut short by a full disk (or by a kill between the writes of a
// long line) would fuse with the next one appended, and the stream would no
// longer parse: it never was a whole record, so it goes. Returns its bytes.
std::uintmax_t drop_unfinished_line(const std::string& path) {
  std::error_code ec;
  const std::uintmax_t size = std::filesystem::file_size(path, ec);
  if (ec || size == 0) return 0;
  std::ifstream in(path, std::ios::binary);
  char buf[4096];
  std::uintmax_t end = size;
  while (end > 0) {
    const std::uintmax_t n = std::min<std::uintmax_t>(end, sizeof buf);
    in.seekg(static_cast<std::streamoff>(end - n));
    if (!in.read(buf, static_cast<std::streamsize>(n))) return 0;
    std::uintmax_t k = n;
    while (k > 0 && buf[k - 1] != '\n') --k;
    if (k > 0 || end == n) {
      end = end - n + k;
      break;
    }
    end -= n;
  }
  if (end == size) return 0;
  std::filesystem::resize_file(path, end, ec);
  return ec ? 0 : size - end;
}

}  // namespace

DlLogger::DlLogger(const std::string& path, bool append) : path_(path), start_(std::chrono::steady_clock::now()) {
  if (append) {
    if (const auto dropped = drop_unfinished_line(path)) {
      std::cerr << "convnets: warning: " << path << ": dropped its unfinished last line (" << dropped
                << " bytes), cut short when the run before stopped\n";
    }
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
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
  out_ << "DLLL " << dump_json(line) << '\n';
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
