#include "io/atomic_file.h"

#include "core/error.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <vector>

namespace convnets {
AtomicFile::AtomicFile(std::string path) : path_(std::move(path)), tmp_(path_ + ".tmp." + std::to_string(::getpid())) {
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(system_error("cannot create", tmp_));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) {
    ::close(fd_);
    ::unlink(tmp_.c_str());
  }
}

void AtomicFile::fail(const std::string& what) {
  const auto msg = system_error(what, tmp_);
  ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());
  throw Error(msg);
}

void AtomicFile::write(const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t w = ::write(fd_, p, size);
    if (w < 0) {
      if (errno == EINTR) continue;
      fail("write failed for");
    }
    p += w;
    size -= static_cast<std::size_t>(w);
  }
}

void AtomicFile::commit() {
  if (::fsync(fd_) != 0) fail("cannot flush");
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const auto msg = system_error("cannot flush", tmp_);
    ::unlink(tmp_.c_str());
    throw Error(msg);
  }
  if (::rename(tmp_.c_str(), path_.c_str()) != 0) {
    const auto msg = system_error("cannot rename temporary file to", path_);
    ::unlink(tmp_.c_str());
    throw Error(msg);
  }
}

void write_file_atomically(const std::string& path, const std::string& contents) {
  AtomicFile out(path);
  out.write(contents.data(), contents.size());
  out.commit();
}

void copy_file_atomically(const std::string& from, const std::string& to) {
  const int in = ::open(from.c_str(), O_RDONLY | O_CLOEXEC);
  if (in < 0) throw Error(system_error("cannot read", from));
  AtomicFile out(to);
  std::vector<char> buffer(1 << 20);
  for (;;) {
    const ssize_t n = ::read(in, buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const auto msg = system_error("cannot read", from);
      ::close(in);
      throw Error(msg);
    }
    if (n == 0) break;
    out.write(buffer.data(), static_cast<std::size_t>(n));
  }
  ::close(in);
  out.commit();
}

}  // namespace convnets
