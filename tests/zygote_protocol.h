// The zygote's wire format (tests/zygote.h), shared by the server and its torch-free client.
#pragma once

#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>
#include <vector>

namespace convnets::zygote {

// A request is this header, sent with the client's stdin, stdout and stderr as
// SCM_RIGHTS when `kind` is kRun, then `length` bytes: `argc` NUL-terminated
// arguments, the working directory, `envc` NUL-terminated NAME=value entries.
// Replies, one byte first: kStarted then the child's wait status (int32, as
// waitpid gives it) when it ends; kFresh then a reason until EOF (the client
// runs the executable itself); kAck for kStop and kPing.
inline constexpr std::uint32_t kMagic = 0x7a79676f;  // "zygo"
enum Kind : std::uint32_t { kRun = 1, kStop = 2, kPing = 3 };
inline constexpr char kStarted = 'R', kFresh = 'F', kAck = 'A';
// Requests carry the client's whole environment; this bounds what the server reads from one.
inline constexpr std::uint32_t kMaxRequest = 16u << 20;

struct Header {
  std::uint32_t magic = kMagic;
  std::uint32_t kind = kRun;
  std::uint32_t argc = 0;
  std::uint32_t envc = 0;
  std::uint32_t length = 0;
};

inline bool write_all(int fd, const void* data, std::size_t size) {
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::send(fd, p, size, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

inline bool read_all(int fd, void* data, std::size_t size) {
  char* p = static_cast<char*>(data);
  while (size > 0) {
    const ssize_t n = ::read(fd, p, size);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return false;
    p += n;
    size -= static_cast<std::size_t>(n);
  }
  return true;
}

inline sockaddr_un address(const std::string& path, bool& fits) {
  sockaddr_un addr{};
  addr.sun_family = AF_UNIX;
  fits = path.size() < sizeof addr.sun_path;
  if (fits) std::memcpy(addr.sun_path, path.c_str(), path.size() + 1);
  return addr;
}

// Sends the header with `fds` attached (none for kStop and kPing).
inline bool send_header(int sock, const Header& header, const std::vector<int>& fds) {
  iovec iov{const_cast<Header*>(&header), sizeof header};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
  if (!fds.empty()) {
    msg.msg_control = control.data();
    msg.msg_controllen = control.size();
    cmsghdr* c = CMSG_FIRSTHDR(&msg);
    c->cmsg_level = SOL_SOCKET;
    c->cmsg_type = SCM_RIGHTS;
    c->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
    std::memcpy(CMSG_DATA(c), fds.data(), sizeof(int) * fds.size());
  }
  for (;;) {
    const ssize_t n = ::sendmsg(sock, &msg, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return false;
    // A stream socket may take part of it; the descriptors went with the first byte.
    return write_all(sock, reinterpret_cast<const char*>(&header) + n, sizeof header - static_cast<std::size_t>(n));
  }
}

// Receives the header and up to three descriptors (close-on-exec).
inline bool receive_header(int sock, Header& header, std::vector<int>& fds) {
  iovec iov{&header, sizeof header};
  msghdr msg{};
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 3)];
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  ssize_t n;
  do n = ::recvmsg(sock, &msg, MSG_CMSG_CLOEXEC);
  while (n < 0 && errno == EINTR);
  if (n <= 0) return false;
  for (cmsghdr* c = CMSG_FIRSTHDR(&msg); c != nullptr; c = CMSG_NXTHDR(&msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_type != SCM_RIGHTS) continue;
    const std::size_t count = (c->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (std::size_t i = 0; i < count; ++i) {
      int fd;
      std::memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
      fds.push_back(fd);
    }
  }
  return read_all(sock, reinterpret_cast<char*>(&header) + n, sizeof header - static_cast<std::size_t>(n));
}

}  // namespace convnets::zygote
