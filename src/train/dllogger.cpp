#include "train/dllogger.h"

#include "core/error.h"
#include "core/json.h"

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <filesystem>
#include <iostream>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

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
  // Locked before anything is cut or appended: a second process given the
  // same log (a --resume of a run that is still going) is refused instead of
  // interleaving its lines and checkpoints with the first's.
  lock_fd_ = ::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644);
  if (lock_fd_ < 0) throw Error(system_error("cannot write the log", path));
  if (::flock(lock_fd_, LOCK_EX | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    ::close(lock_fd_);
    throw Error(path + " is being written by another convnets process: a run in this workspace is still going",
                "wait for it to end (or stop it) before resuming; or give this run another --workspace");
  }
  // Any other flock failure (a file system without it) only costs
  // report --watch its way to notice a killed run, so it is not an error.
  if (append) {
    if (const auto dropped = drop_unfinished_line(path)) {
      std::cerr << "convnets: warning: " << path << ": dropped its unfinished last line (" << dropped
                << " bytes), cut short when the run before stopped\n";
    }
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) {
    ::close(lock_fd_);
    throw Error(system_error("cannot write the log", path));
  }
}

DlLogger::~DlLogger() { ::close(lock_fd_); }

std::optional<bool> being_written(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return std::nullopt;
  const int failed = ::flock(fd, LOCK_SH | LOCK_NB) != 0 ? errno : 0;
  ::close(fd);  // releases the lock if it was taken
  if (failed == 0) return false;
  if (failed == EWOULDBLOCK) return true;
  return std::nullopt;
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
