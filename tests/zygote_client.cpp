// CTest's side of the GoogleTest zygote (tests/zygote.h): runs one case in a child of the zygote, or the executable itself.
//
//   zygote_client SOCKET EXE [ARGS...]   EXE ARGS as a child of EXE's zygote at SOCKET; EXE itself when none answers
//   zygote_client --start SOCKET EXE     (re)starts EXE's zygote there, detached, once it answers
//   zygote_client --stop SOCKET          stops it
//
// It links nothing but the C++ runtime, so it starts in a millisecond.
#include "zygote_protocol.h"

#include <cerrno>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fcntl.h>
#include <string>
#include <sys/wait.h>
#include <thread>
#include <unistd.h>
#include <vector>

extern char** environ;

namespace {

using namespace convnets::zygote;

int connect_to(const std::string& path) {
  bool fits = false;
  const sockaddr_un addr = address(path, fits);
  if (!fits) return -1;
  const int sock = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (sock < 0) return -1;
  if (::connect(sock, reinterpret_cast<const sockaddr*>(&addr), sizeof addr) != 0) {
    ::close(sock);
    return -1;
  }
  return sock;
}

// kPing or kStop: true when a zygote answered.
bool tell(const std::string& path, Kind kind) {
  const int sock = connect_to(path);
  if (sock < 0) return false;
  Header h;
  h.kind = kind;
  char ack = 0;
  const bool ok = send_header(sock, h, {}) && read_all(sock, &ack, 1) && ack == kAck;
  ::close(sock);
  return ok;
}

[[noreturn]] void exec_itself(char** argv) {
  ::execv(argv[0], argv);
  std::fprintf(stderr, "zygote_client: cannot run %s: %s\n", argv[0], std::strerror(errno));
  std::_Exit(127);
}

[[noreturn]] void run(const std::string& path, char** argv) {
  const int sock = connect_to(path);
  if (sock < 0) exec_itself(argv);  // no zygote (a build's test discovery, a case run by hand): the plain way
  std::string blob;
  Header h;
  for (char** a = argv; *a != nullptr; ++a, ++h.argc) blob.append(*a).push_back('\0');
  std::vector<char> cwd(4096);
  if (::getcwd(cwd.data(), cwd.size()) == nullptr) exec_itself(argv);
  blob.append(cwd.data()).push_back('\0');
  for (char** e = environ; *e != nullptr; ++e, ++h.envc) blob.append(*e).push_back('\0');
  h.length = static_cast<std::uint32_t>(blob.size());
  char tag = 0;
  if (blob.size() > kMaxRequest || !send_header(sock, h, {0, 1, 2}) || !write_all(sock, blob.data(), blob.size()) ||
      !read_all(sock, &tag, 1)) {
    std::fprintf(stderr, "zygote_client: the zygote at %s did not take the request; running %s itself\n",
                 path.c_str(), argv[0]);
    exec_itself(argv);
  }
  if (tag == kFresh) {
    std::string reason;
    char c;
    while (read_all(sock, &c, 1)) reason.push_back(c);
    std::fprintf(stderr, "zygote_client: %s; running %s itself\n", reason.c_str(), argv[0]);
    exec_itself(argv);
  }
  std::int32_t status = 0;
  if (tag != kStarted || !read_all(sock, &status, sizeof status)) {
    std::fprintf(stderr, "zygote_client: the zygote at %s went away while %s ran\n", path.c_str(), argv[0]);
    std::exit(1);
  }
  if (WIFEXITED(status)) std::exit(WEXITSTATUS(status));
  if (WIFSIGNALED(status)) {
    // CTest reports a crash by the signal it sees: this process dies of the child's (unblocked, should the
    // client have inherited it blocked).
    std::signal(WTERMSIG(status), SIG_DFL);
    sigset_t only;
    sigemptyset(&only);
    sigaddset(&only, WTERMSIG(status));
    sigprocmask(SIG_UNBLOCK, &only, nullptr);
    std::raise(WTERMSIG(status));
  }
  std::exit(1);
}

int start(const std::string& path, const std::string& exe) {
  bool fits = false;
  (void)address(path, fits);
  if (!fits) {
    std::printf("zygote_client: %s is too long for a Unix socket; each case starts %s itself\n", path.c_str(),
                exe.c_str());
    return 0;
  }
  if (tell(path, kStop)) {
    for (int i = 0; i < 200 && ::access(path.c_str(), F_OK) == 0; ++i) {
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    }
  }
  const std::string log = path + ".log";
  const pid_t pid = ::fork();
  if (pid < 0) {
    std::fprintf(stderr, "zygote_client: fork: %s\n", std::strerror(errno));
    return 1;
  }
  if (pid == 0) {
    // Detached, and holding none of CTest's pipes: CTest waits for those to close before it ends the test.
    ::setsid();
    const int in = ::open("/dev/null", O_RDONLY);
    const int out = ::open(log.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (in < 0 || out < 0 || ::dup2(in, 0) < 0 || ::dup2(out, 1) < 0 || ::dup2(out, 2) < 0) std::_Exit(127);
    ::close_range(3, ~0U, 0);
    if (::fork() != 0) std::_Exit(0);  // the server is nobody's child: CTest does not wait for it
    const char* argv[] = {exe.c_str(), "--zygote", path.c_str(), nullptr};
    ::execv(exe.c_str(), const_cast<char**>(argv));
    std::fprintf(stderr, "zygote_client: cannot run %s: %s\n", exe.c_str(), std::strerror(errno));
    std::_Exit(127);
  }
  ::waitpid(pid, nullptr, 0);
  // LibTorch loads in about 0.4 s; a sanitizer build or a loaded machine takes longer.
  for (int i = 0; i < 1200; ++i) {
    if (tell(path, kPing)) {
      std::printf("zygote for %s at %s\n", exe.c_str(), path.c_str());
      return 0;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::fprintf(stderr, "zygote_client: %s --zygote %s did not answer within 60 s; its log, %s:\n", exe.c_str(),
               path.c_str(), log.c_str());
  if (FILE* f = std::fopen(log.c_str(), "r")) {
    char buf[4096];
    while (std::size_t n = std::fread(buf, 1, sizeof buf, f)) std::fwrite(buf, 1, n, stderr);
    std::fclose(f);
  }
  return 1;
}

int usage() {
  std::fprintf(stderr,
               "usage: zygote_client SOCKET EXE [ARGS...] | zygote_client --start SOCKET EXE | "
               "zygote_client --stop SOCKET\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  if (argc < 2) return usage();
  const std::string first = argv[1];
  if (first == "--start") return argc == 4 ? start(argv[2], argv[3]) : usage();
  if (first == "--stop") {
    if (argc != 3) return usage();
    std::printf(tell(argv[2], kStop) ? "stopped the zygote at %s\n" : "no zygote answered at %s\n", argv[2]);
    return 0;
  }
  if (argc < 3) return usage();
  run(first, argv + 2);
}
