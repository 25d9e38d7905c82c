#include "distributed/launcher.h"

#include "core/error.h"
#include "distributed/group.h"

#include <netinet/in.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <thread>

namespace convnets::distributed {
namespace {

std::vector<std::string> g_args;
std::atomic<int> g_forward_signal{0};

extern "C" void forward_signal(int sig) { g_forward_signal.store(sig); }

void check_port_free(int port) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return;
  int one = 1;
  ::setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_ANY);
  a.sin_port = htons(static_cast<std::uint16_t>(port));
  const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0 && ::listen(fd, 1) == 0;
  const int err = errno;
  ::close(fd);
  if (!ok) {
    throw Error("--master-port " + std::to_string(port) + " is not free on this machine: " + std::strerror(err),
                "another job uses it; pick another --master-port (rank 0 serves the rendezvous store there)");
  }
}

std::string describe(int status) {
  if (WIFSIGNALED(status)) {
    const int sig = WTERMSIG(status);
    return std::string("was killed by signal ") + std::to_string(sig) + " (" + ::strsignal(sig) + ")";
  }
  return "exited with code " + std::to_string(WEXITSTATUS(status));
}

int exit_code(int status) { return WIFSIGNALED(status) ? 128 + WTERMSIG(status) : WEXITSTATUS(status); }

}  // namespace

void set_program_args(int argc, char** argv) { g_args.assign(argv, argv + argc); }
const std::vector<std::string>& program_args() { return g_args; }

int launch_workers(const WorkerEnv& plan, const std::vector<std::string>& argv, double grace_s,
                   const std::vector<std::pair<std::string, std::string>>& extra_env) {
  if (argv.empty()) throw Error("launcher: no command line to run");
  check_master_address(plan, /*serves_store=*/plan.node_rank == 0);
  if (plan.node_rank == 0) check_port_free(plan.master_port);
  const int n = plan.local_world_size;
  const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
  const std::string threads = std::to_string(std::max(1u, cpus / static_cast<unsigned>(n)));

  std::vector<char*> cargv;
  for (const auto& a : argv) cargv.push_back(const_cast<char*>(a.c_str()));
  cargv.push_back(nullptr);
  // /proc/self/exe: the same binary even when argv[0] is a bare name found on PATH.
  const std::string self = "/proc/self/exe";

  auto* old_int = std::signal(SIGINT, forward_signal);
  auto* old_term = std::signal(SIGTERM, forward_signal);
  std::vector<pid_t> pids(static_cast<std::size_t>(n), -1);
  for (int local = 0; local < n; ++local) {
    const pid_t pid = ::fork();
    if (pid < 0) throw SystemError("launcher: cannot start worker", std::to_string(local));
    if (pid == 0) {
      ::signal(SIGINT, SIG_DFL);
      ::signal(SIGTERM, SIG_DFL);
      const int rank = plan.node_rank * n + local;
      ::setenv("RANK", std::to_string(rank).c_str(), 1);
      ::setenv("WORLD_SIZE", std::to_string(plan.world_size).c_str(), 1);
      ::setenv("LOCAL_RANK", std::to_string(local).c_str(), 1);
      ::setenv("LOCAL_WORLD_SIZE", std::to_string(n).c_str(), 1);
      ::setenv("GROUP_RANK", std::to_string(plan.node_rank).c_str(), 1);
      ::setenv("MASTER_ADDR", plan.master_addr.c_str(), 1);
      ::setenv("MASTER_PORT", std::to_string(plan.master_port).c_str(), 1);
      ::setenv("CONVNETS_LAUNCHER", "1", 1);
      ::setenv("OMP_NUM_THREADS", threads.c_str(), 0);
      for (const auto& [k, v] : extra_env) ::setenv(k.c_str(), v.c_str(), 1);
      ::execv(self.c_str(), cargv.data());
      std::perror("convnets launcher: exec");
      ::_exit(127);
    }
    pids[static_cast<std::size_t>(local)] = pid;
  }

  using clock = std::chrono::steady_clock;
  int first_failure = 0, alive = n;
  clock::time_point deadline{}, kill_at{};
  bool terminated = false;
  while (alive > 0) {
    if (const int sig = g_forward_signal.exchange(0)) {
      for (pid_t p : pids) {
        if (p > 0) ::kill(p, sig);
      }
    }
    int status = 0;
    const pid_t done = ::waitpid(-1, &status, WNOHANG);
    if (done > 0) {
      for (int local = 0; local < n; ++local) {
        if (pids[static_cast<std::size_t>(local)] != done) continue;
        pids[static_cast<std::size_t>(local)] = -1;
        --alive;
        const bool failed = !(WIFEXITED(status) && WEXITSTATUS(status) == 0);
        if (failed) {
          std::cerr << "convnets launcher: worker rank " << plan.node_rank * n + local << " (pid " << done << ") "
                    << describe(status) << '\n';
          if (first_failure == 0) {
            first_failure = exit_code(status);
            deadline = clock::now() + std::chrono::milliseconds(static_cast<std::int64_t>(grace_s * 1000));
          }
        }
      }
      continue;
    }
    if (first_failure != 0 && alive > 0) {
      const auto now = clock::now();
      if (!terminated && now > deadline) {
        std::cerr << "convnets launcher: terminating the " << alive << " remaining worker(s)\n";
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGTERM);
        }
        terminated = true;
        kill_at = now + std::chrono::seconds(5);
      } else if (terminated && now > kill_at) {
        for (pid_t p : pids) {
          if (p > 0) ::kill(p, SIGKILL);
        }
        kill_at = now + std::chrono::hours(1);
      }
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  return first_failure;
}

}  // namespace convnets::distributed
