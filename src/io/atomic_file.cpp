#include "io/atomic_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <filesystem>

namespace convnets {
namespace {

constexpr const char* kTmpMark = ".tmp.";

std::string parent_dir(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? std::string(".") : parent.string();
}

std::string mib(std::uint64_t bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f MiB (%llu bytes)", static_cast<double>(bytes) / (1 << 20),
                static_cast<unsigned long long>(bytes));
  return buf;
}

// ENOSPC, EDQUOT and EFBIG: what the user must act on is the space, so the
// message gives the bytes needed and what statvfs says is left (read after
// the temporary file is gone, so it is what another attempt would have).
Error no_space_error(int err, const std::string& path, std::uint64_t needed, bool at_least) {
  const std::string dir = parent_dir(path);
  std::string free_text = "unknown free space";
  struct statvfs vfs {};
  if (::statvfs(dir.c_str(), &vfs) == 0) {
    free_text = mib(static_cast<std::uint64_t>(vfs.f_bavail) * vfs.f_frsize) + " free";
  }
  return Error("cannot write '" + path + "': " + std::strerror(err) + ": it needs " + (at_least ? "at least " : "") +
                   mib(needed) + ", the filesystem of '" + dir + "' has " + free_text,
               "free space there (or lift the quota or file-size limit) and run again; the previous '" + path +
                   "', if any, is unchanged and no partial file was left");
}

// Renames are durable only once the directory itself is on disk; a power
// loss could otherwise bring the old file back. Some filesystems refuse a
// directory fsync: the rename has happened, so that is not an error.
void sync_directory(const std::string& path) {
  const int fd = ::open(parent_dir(path).c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  (void)::fsync(fd);
  ::close(fd);
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::uint64_t size)
    : path_(std::move(path)), tmp_(path_ + kTmpMark + std::to_string(::getpid())), size_(size) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) {
    if (errno == ENOSPC || errno == EDQUOT) throw no_space_error(errno, path_, size_, false);
    throw SystemError("cannot create", tmp_);
  }
  if (size_ > 0) {
    int rc;
    do rc = ::fallocate(fd_, 0, 0, static_cast<off_t>(size_));
    while (rc != 0 && errno == EINTR);
    // A filesystem without fallocate still gets the same message from write().
    if (rc != 0 && (errno == ENOSPC || errno == EDQUOT || errno == EFBIG)) fail("cannot reserve space for");
  }
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::fail(const std::string& what, std::uint64_t pending) {
  const int err = errno;
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  if (err == ENOSPC || err == EDQUOT || err == EFBIG) {
    const bool known = size_ > 0;
    throw no_space_error(err, path_, known ? size_ : written_ + pending, !known);
  }
  errno = err;
  throw SystemError(what, tmp_);
}

void AtomicFile::write(const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::write(fd_, p, size);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed for", size);
    }
    p += w;
    size -= static_cast<std::size_t>(w);
    const std::uint64_t before = written_;
    written_ += static_cast<std::uint64_t>(w);
#if defined(__linux__)
    // The disk starts on each 32 MiB as it is written, rather than all of it at commit()'s fsync: the writer's
    // work after it (the next tensors, a checkpoint's checksums) then runs while the disk writes.
    constexpr std::uint64_t kWriteback = std::uint64_t{32} << 20;
    if (before / kWriteback != written_ / kWriteback) {
      (void)::sync_file_range(fd_, static_cast<off_t>(written_ / kWriteback * kWriteback - kWriteback),
                              static_cast<off_t>(kWriteback), SYNC_FILE_RANGE_WRITE);
    }
#endif
  }
}

void AtomicFile::rewrite(std::uint64_t offset, const void* data, std::size_t size) {
  if (offset + size > written_) {
    throw Error("cannot rewrite bytes " + std::to_string(offset) + ".." + std::to_string(offset + size) + " of " + tmp_ +
                ": only " + std::to_string(written_) + " are written");
  }
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::pwrite(fd_, p, size, static_cast<off_t>(offset));
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed for", size);
    }
    p += w;
    offset += static_cast<std::uint64_t>(w);
    size -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  // The reservation is the caller's estimate: the file is what was written.
  if (size_ > written_ && ::ftruncate(fd_, static_cast<off_t>(written_)) != 0) fail("cannot truncate");
  if (::fsync(fd_) != 0) fail("cannot flush");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(tmp_.c_str());
    if (err == ENOSPC || err == EDQUOT) throw no_space_error(err, path_, written_, false);
    errno = err;
    throw SystemError("cannot flush", tmp_);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const auto msg = system_error("cannot rename temporary file to", path_);
    ::unlink(tmp_.c_str());
    throw Error(msg);
  }
  sync_directory(path_);
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  AtomicFile out(path, contents.size());
  out.write(contents.data(), contents.size());
  out.commit();
}

void copy_file_atomically(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw SystemError("cannot read", from);
  struct stat st {};
  const std::uint64_t size = ::fstat(in, &st) == 0 ? static_cast<std::uint64_t>(st.st_size) : 0;
  std::vector<char> buffer(1 << 20);
  try {
    AtomicFile out(to, size);
    for (;;) {
      const ssize_t n = ::read(in, buffer.data(), buffer.size());
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw SystemError("cannot read", from);
      if (n == 0) break;
      out.write(buffer.data(), static_cast<std::size_t>(n));
    }
    out.commit();
  } catch (...) {
    ::close(in);
    throw;
  }
  ::close(in);
}

std::vector<std::string> remove_stale_temporaries(const std::string& dir) {
  std::vector<std::string> removed;
  std::error_code ec;
  for (const auto& entry : std::filesystem::directory_iterator(dir, ec)) {
    const std::string name = entry.path().filename().string();
    const auto mark = name.rfind(kTmpMark);
    if (mark == std::string::npos || mark == 0) continue;
    const std::string digits = name.substr(mark + std::string(kTmpMark).size());
    if (digits.empty() || digits.size() > 9 || digits.find_first_not_of("0123456789") != std::string::npos) continue;
    const pid_t pid = static_cast<pid_t>(std::stol(digits));
    // A live process of that id may be a writer (or an unrelated process that
    // reused the id): its file is left alone.
    if (pid == ::getpid() || ::kill(pid, 0) == 0 || errno != ESRCH) continue;
    if (std::filesystem::remove(entry.path(), ec)) removed.push_back(entry.path().string());
  }
  return removed;
}

}  // namespace convnets
