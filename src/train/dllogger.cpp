#include "train/dllogger.h"

#include "core/error.h"
#include "core/json.h"

#include <algorithm>
#include <cerrno>
#include <ctime>
#include <cstring>
#include <iostream>
#include <thread>

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

namespace convnets::train {

namespace {

// A record cut short by a full disk (or by a kill between the writes of a
// long line) would fuse with the next one appended, and the stream would no
// longer parse: it never was a whole record, so it goes. Returns its bytes.
// Through the lock's descriptor: on NFS, where flock is a POSIX lock, closing
// any other descriptor of the file would drop the lock.
std::uintmax_t drop_unfinished_line(int fd) {
  struct stat st{};
  if (::fstat(fd, &st) != 0 || st.st_size <= 0) return 0;
  const auto size = static_cast<std::uintmax_t>(st.st_size);
  char buf[4096];
  std::uintmax_t end = size;
  while (end > 0) {
    const std::uintmax_t n = std::min<std::uintmax_t>(end, sizeof buf);
    if (::pread(fd, buf, n, static_cast<off_t>(end - n)) != static_cast<ssize_t>(n)) return 0;
    std::uintmax_t k = n;
    while (k > 0 && buf[k - 1] != '\n') --k;
    if (k > 0 || end == n) {
      end = end - n + k;
      break;
    }
    end -= n;
  }
  if (end == size) return 0;
  return ::ftruncate(fd, static_cast<off_t>(end)) == 0 ? size - end : 0;
}

}  // namespace

LogLock LogLock::take(const std::string& path, bool create) {
  LogLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CLOEXEC | (create ? O_CREAT : 0), 0644);
  if (lock.fd_ < 0) {
    if (!create && errno == ENOENT) return lock;
    throw SystemError("cannot write the log", path);
  }
  // report --watch holds the lock shared for an instant when it probes:
  // a run starting at that instant waits it out rather than refusing itself.
  for (int attempt = 0;; ++attempt) {
    if (::flock(lock.fd_, LOCK_EX | LOCK_NB) == 0) {
      lock.held_ = true;
      return lock;
    }
    if (errno != EWOULDBLOCK && errno != EINTR) {
      std::cerr << "convnets: warning: " << path << ": its file system does not lock files ("
                << std::strerror(errno) << "): a second run in this workspace is not refused, and report --watch "
                << "cannot tell whether this run is still going\n";
      return lock;
    }
    if (attempt == 20) {
      throw Error(path + " is being written by another convnets process: a run in this workspace is still going",
                  "wait for it to end (or stop it) before resuming; or give this run another --workspace");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
}

LogLock& LogLock::operator=(LogLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
    held_ = std::exchange(other.held_, false);
  }
  return *this;
}

LogLock::~LogLock() {
  if (fd_ >= 0) ::close(fd_);
}

DlLogger::DlLogger(const std::string& path, bool append, LogLock lock)
    : path_(path),
      start_(std::chrono::steady_clock::now()),
      // Locked before anything is cut or appended: a second process given the
      // same log (a --resume of a run that is still going) is refused instead
      // of interleaving its lines and checkpoints with the first's.
      lock_(lock.fd() >= 0 ? std::move(lock) : LogLock::take(path, /*create=*/true)) {
  if (append) {
    if (const auto dropped = drop_unfinished_line(lock_.fd())) {
      std::cerr << "convnets: warning: " << path << ": dropped its unfinished last line (" << dropped
                << " bytes), cut short when the run before stopped\n";
    }
  }
  out_.open(path, append ? std::ios::app : std::ios::trunc);
  if (!out_) throw SystemError("cannot write the log", path);
}

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
  if (!out_) throw SystemError("cannot write the log", path_);
}

void DlLogger::metadata(const std::string& metric, const nlohmann::json& metadata) {
  write({{"type", "METADATA"}, {"metric", metric}, {"metadata", metadata}});
}

void DlLogger::log(const nlohmann::json& step, const nlohmann::json& data) {
  write({{"type", "LOG"}, {"step", step}, {"data", data}});
}

}  // namespace convnets::train
