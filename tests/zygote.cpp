#include "zygote.h"

#include "core/process_exit.h"
#include "zygote_protocol.h"

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <ctime>
#include <map>
#include <poll.h>
#include <stdio_ext.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>
#include <vector>

extern char** environ;

namespace convnets::testing {
namespace {

using namespace convnets::zygote;

struct Identity {
  dev_t dev = 0;
  ino_t ino = 0;
  timespec mtime{};
  bool operator==(const Identity& o) const {
    return dev == o.dev && ino == o.ino && mtime.tv_sec == o.mtime.tv_sec && mtime.tv_nsec == o.mtime.tv_nsec;
  }
};

bool identify(const std::string& path, Identity& id) {
  struct stat st{};
  if (::stat(path.c_str(), &st) != 0) return false;
  id = {st.st_dev, st.st_ino, st.st_mtim};
  return true;
}

// The variables that act while the libraries load (tests/python/runner.py keeps the same list).
bool load_time(const std::string& entry) {
  for (const char* prefix : {"LD_", "MALLOC_", "OMP_", "GOMP_", "KMP_", "GLIBC_TUNABLES", "ASAN_", "LSAN_", "UBSAN_"}) {
    if (entry.rfind(prefix, 0) == 0) return true;
  }
  return false;
}

std::vector<std::string> load_time_of(const std::vector<std::string>& env) {
  std::vector<std::string> out;
  for (const auto& e : env) {
    if (load_time(e)) out.push_back(e);
  }
  std::sort(out.begin(), out.end());
  return out;
}

struct Request {
  std::vector<std::string> argv, env;
  std::string cwd;
};

bool parse(const Header& h, const std::vector<char>& blob, Request& r) {
  // Every entry takes at least its NUL: counts the blob cannot hold are refused before anything is sized by them.
  if (h.argc == 0 || std::uint64_t{h.argc} + h.envc + 1 > blob.size()) return false;
  std::size_t at = 0;
  const auto next = [&](std::string& out) {
    const void* end = std::memchr(blob.data() + at, '\0', blob.size() - at);
    if (end == nullptr) return false;
    const std::size_t stop = static_cast<std::size_t>(static_cast<const char*>(end) - blob.data());
    out.assign(blob.data() + at, stop - at);
    at = stop + 1;
    return true;
  };
  r.argv.resize(h.argc);
  r.env.resize(h.envc);
  for (auto& a : r.argv) {
    if (!next(a)) return false;
  }
  if (!next(r.cwd)) return false;
  for (auto& e : r.env) {
    if (!next(e)) return false;
  }
  return at == blob.size();
}

void refuse(int conn, const std::string& reason) {
  const std::string text = std::string(1, kFresh) + reason;
  (void)write_all(conn, text.data(), text.size());
}

// In the child: becomes the client's process, as far as a fork can.
[[noreturn]] void become(Request& r, const std::vector<int>& fds, int (*run)(int, char**)) {
  for (int i = 0; i < 3; ++i) {
    if (::dup2(fds[i], i) < 0) std::_Exit(127);
  }
  for (int fd : fds) ::close(fd);
  __fpurge(stdin);
  std::clearerr(stdin);
  std::signal(SIGPIPE, SIG_DFL);
  if (::chdir(r.cwd.c_str()) != 0) {
    std::fprintf(stderr, "zygote: cd %s: %s\n", r.cwd.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  ::clearenv();
  for (auto& e : r.env) ::putenv(e.data());  // r lives until _Exit
  std::vector<char*> argv;
  for (auto& a : r.argv) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::exit(finish(run(static_cast<int>(r.argv.size()), argv.data())));
}

}  // namespace

int serve_zygote(const std::string& socket_path, int (*run)(int, char**), int idle_seconds) {
  Identity self;
  if (!identify("/proc/self/exe", self)) {
    std::fprintf(stderr, "zygote: cannot stat /proc/self/exe: %s\n", std::strerror(errno));
    return 1;
  }
  std::vector<std::string> own_env;
  for (char** e = environ; *e != nullptr; ++e) own_env.emplace_back(*e);
  const auto own_load_time = load_time_of(own_env);

  bool fits = false;
  const sockaddr_un addr = address(socket_path, fits);
  if (!fits) {
    std::fprintf(stderr, "zygote: socket path too long (%zu bytes): %s\n", socket_path.size(), socket_path.c_str());
    return 1;
  }
  const int listener = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  ::unlink(socket_path.c_str());
  if (listener < 0 || ::bind(listener, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0 ||
      ::listen(listener, 64) != 0) {
    std::fprintf(stderr, "zygote: %s: %s\n", socket_path.c_str(), std::strerror(errno));
    return 1;
  }
  Identity socket_id;
  identify(socket_path, socket_id);
  std::signal(SIGPIPE, SIG_IGN);

  std::map<pid_t, int> running;  // child -> its client's connection
  std::time_t last_seen = std::time(nullptr);
  for (;;) {
    std::vector<pollfd> fds{{listener, POLLIN, 0}};
    std::vector<pid_t> order;
    for (const auto& [pid, conn] : running) {
      fds.push_back({conn, POLLIN, 0});  // a client sends nothing more: readable means it went away
      order.push_back(pid);
    }
    // While children run, wake often to report their ends; SIGCHLD would race with poll without a self-pipe.
    const int n = ::poll(fds.data(), fds.size(), running.empty() ? 1000 : 5);
    if (n < 0 && errno != EINTR) return 1;

    for (std::size_t i = 1; i < fds.size(); ++i) {
      if (fds[i].revents != 0) ::kill(order[i - 1], SIGKILL);
    }
    for (;;) {
      int status = 0;
      const pid_t pid = ::waitpid(-1, &status, WNOHANG);
      if (pid <= 0) break;
      const auto it = running.find(pid);
      if (it == running.end()) continue;
      const std::int32_t word = status;
      (void)write_all(it->second, &word, sizeof word);
      ::close(it->second);
      running.erase(it);
    }

    if (fds[0].revents & POLLIN) {
      const int conn = ::accept4(listener, nullptr, nullptr, SOCK_CLOEXEC);
      if (conn < 0) continue;
      last_seen = std::time(nullptr);
      const timeval limit{10, 0};  // a client that connects and stalls must not stall the others
      ::setsockopt(conn, SOL_SOCKET, SO_RCVTIMEO, &limit, sizeof limit);
      Header h;
      std::vector<int> passed;
      const auto drop = [&] {
        for (int fd : passed) ::close(fd);
        ::close(conn);
      };
      if (!receive_header(conn, h, passed) || h.magic != kMagic) {
        drop();
        continue;
      }
      if (h.kind == kPing || h.kind == kStop) {
        (void)write_all(conn, &kAck, 1);
        drop();
        if (h.kind == kStop) break;
        continue;
      }
      // The declared size is checked before a buffer of that size exists.
      const bool sane = h.kind == kRun && passed.size() == 3 && h.length <= kMaxRequest;
      std::vector<char> blob(sane ? h.length : 0);
      Request r;
      if (!sane || !read_all(conn, blob.data(), blob.size()) || !parse(h, blob, r)) {
        refuse(conn, "malformed request");
        drop();
        continue;
      }
      // /proc/self/exe still names the loaded file after a rebuild replaced it; the path the client runs does not.
      Identity asked;
      const std::string named = r.argv[0].rfind('/', 0) == 0 ? r.argv[0] : r.cwd + '/' + r.argv[0];
      if (!identify(named, asked) || !(asked == self)) {
        refuse(conn, r.argv[0] + " is not the file the zygote loaded (rebuilt since the zygote started, or another)");
        drop();
        continue;
      }
      if (load_time_of(r.env) != own_load_time) {
        refuse(conn, "load-time variables (LD_*, OMP_*, MALLOC_*, ...) differ from the zygote's");
        drop();
        continue;
      }
      const pid_t pid = ::fork();
      if (pid == 0) {
        ::close(listener);
        for (const auto& [other, c] : running) ::close(c);
        ::close(conn);
        become(r, passed, run);
      }
      for (int fd : passed) ::close(fd);
      if (pid < 0) {
        refuse(conn, std::string("fork: ") + std::strerror(errno));
        ::close(conn);
        continue;
      }
      (void)write_all(conn, &kStarted, 1);
      running[pid] = conn;
    }

    if (running.empty()) {
      Identity path_now;
      const bool replaced = !identify(socket_path, path_now) || !(path_now == socket_id);
      if (replaced || std::time(nullptr) - last_seen > idle_seconds) break;
    }
  }
  for (const auto& [pid, conn] : running) {
    ::kill(pid, SIGKILL);
    ::waitpid(pid, nullptr, 0);
    ::close(conn);
  }
  Identity path_now;
  if (identify(socket_path, path_now) && path_now == socket_id) ::unlink(socket_path.c_str());
  ::close(listener);
  return 0;
}

}  // namespace convnets::testing
