#include "serve/server.h"

#include "core/error.h"
#include "serve/http_routes.h"
#include "serve/serving_core.h"
#ifdef CONVNETS_GRPC
#include "serve/grpc_service.h"
#endif

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <memory>
#include <thread>

namespace convnets::serve {
namespace {

using Clock = std::chrono::steady_clock;

std::string url(const std::string& host, int port) {
  return "http://" + (host.find(':') != std::string::npos ? "[" + host + "]" : host) + ":" + std::to_string(port);
}

// The core and its fronts. Ends in order: gRPC's calls and the workers hold answers into the core and the HTTP
// fronts, so they are stopped before either goes.
class Server {
 public:
  explicit Server(const ServerOptions& o) : o_(o), core_(o), http_(core_, o) {}
  ~Server() {
    shutdown_grpc();
    core_.finish();
  }

  int serve() {
    const auto [port, mport] = http_.bind();
    std::string grpc_line = "gRPC off (--grpc-port -1)";
#ifdef CONVNETS_GRPC
    if (o_.grpc_port >= 0) {
      GrpcOptions g;
      g.host = o_.host;
      g.port = o_.grpc_port;
      g.limits = o_.limits;
      g.restricted = o_.grpc_restricted;
      grpc_ = std::make_unique<GrpcService>(core_, g);
      grpc_line = "gRPC on " + url(o_.host, grpc_->port()).substr(7) + " (Triton's GRPCInferenceService)";
    }
#else
    grpc_line = "gRPC not in this build (Debian's libgrpc++-dev and protobuf-compiler-grpc)";
#endif
    for (const auto& line : core_.describe()) std::printf("convnets serve: %s\n", line.c_str());
    const bool loopback = o_.host.rfind("127.", 0) == 0 || o_.host == "::1" || o_.host == "localhost";
    if (!loopback && !o_.http_restricted.any()) {
      // Shared-memory registration maps this machine's memory for whoever asks: say so once, not silently.
      std::fprintf(stderr, "convnets serve: --host %s reaches beyond this machine and no endpoint is restricted: any "
                   "client may register shared memory; see --http-restricted-api (docs/SERVE.md)\n", o_.host.c_str());
    }
    // Before the HTTP line, which a supervisor (or a test) reads as the server being up.
    std::printf("convnets serve: %s\n", grpc_line.c_str());
    std::printf("convnets serve: HTTP on %s (KServe v2), metrics on %s/metrics\n", url(o_.host, port).c_str(),
                (mport >= 0 ? url(o_.host, mport) : url(o_.host, port)).c_str());
    std::fflush(stdout);
    http_.run();
    // Drained by now (the HTTP front stops once nothing is in flight, gRPC's calls included): what remains are
    // calls that came after, answered 503 before the service stops.
    shutdown_grpc();
    core_.finish();
    return 0;
  }

  // From the signal thread. begin_drain refuses new requests (503); stop_when_drained, called on every tick after
  // it, stops the fronts once nothing is in flight or the drain timeout has passed (a stop before they run is kept
  // for them).
  void begin_drain(const char* why) {
    drain_began_ = Clock::now();
    std::fprintf(stderr, "convnets serve: %s: draining %d request(s) in flight; new requests get 503\n", why,
                 core_.begin_drain());
  }
  void stop_when_drained() {
    const int left = core_.in_flight();
    if (left > 0 && Clock::now() - drain_began_ < std::chrono::seconds(o_.drain_timeout_s)) return;
    if (stopped_.exchange(true)) return;
    if (left > 0) {
      std::fprintf(stderr, "convnets serve: %d request(s) still running after --drain-timeout-s %d; stopping\n", left,
                   o_.drain_timeout_s);
    }
    http_.stop();
  }
  Clock::time_point drain_began() const { return drain_began_; }
  std::string answered() const { return core_.answered(); }

 private:
  void shutdown_grpc() {
#ifdef CONVNETS_GRPC
    if (grpc_) grpc_->shutdown();
#endif
  }

  const ServerOptions& o_;
  ServingCore core_;
  HttpService http_;
#ifdef CONVNETS_GRPC
  std::unique_ptr<GrpcService> grpc_;
#endif
  std::atomic<bool> stopped_{false};
  Clock::time_point drain_began_{};
};

// SIGTERM and SIGINT write their number to a pipe that one thread reads: the drain they start locks and waits,
// which no handler may do. A handler, not a blocked mask and sigwait: threads made before `serve` runs (LibTorch's,
// OpenVINO's) would not have the mask, and a signal the kernel gave one of them would end the process.
int g_signal_pipe[2] = {-1, -1};

extern "C" void on_stop_signal(int sig) {
  const char c = static_cast<char>(sig);
  const int saved = errno;
  (void)!::write(g_signal_pipe[1], &c, 1);
  errno = saved;
}

class StopSignals {
 public:
  StopSignals() {
    if (::pipe2(g_signal_pipe, O_CLOEXEC | O_NONBLOCK) != 0) throw Error(std::string("serve: pipe2: ") + std::strerror(errno));
    struct sigaction sa {};
    sa.sa_handler = on_stop_signal;
    sigemptyset(&sa.sa_mask);
    sa.sa_flags = SA_RESTART;
    sigaction(SIGTERM, &sa, &old_term_);
    sigaction(SIGINT, &sa, &old_int_);
  }
  // The handlers stay: the process ends after the server, and a second SIGTERM during the drain must not end it
  // with status 143 before every accepted request is answered.
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;
  // The signal taken, or 0 when `timeout_ms` passed without one.
  int wait(int timeout_ms) const {
    pollfd p{g_signal_pipe[0], POLLIN, 0};
    if (::poll(&p, 1, timeout_ms) <= 0) return 0;
    char c = 0;
    return ::read(g_signal_pipe[0], &c, 1) == 1 ? c : 0;
  }

 private:
  struct sigaction old_term_ {}, old_int_ {};
};

// A thousand connections need a thousand descriptors: the soft limit is raised to fit --max-connections twice (and
// the models' own files), not to the hard limit: past --max-connections the front end stops accepting and the
// kernel's backlog holds the rest, instead of an unbounded number of open sockets.
void raise_descriptor_limit(int max_connections) {
  rlimit r{};
  const rlim_t want = 2 * static_cast<rlim_t>(max_connections) + 256;
  if (getrlimit(RLIMIT_NOFILE, &r) == 0 && r.rlim_cur < want) {
    r.rlim_cur = std::min(want, r.rlim_max);
    setrlimit(RLIMIT_NOFILE, &r);
  }
}

}  // namespace

int run_server(const ServerOptions& options) {
  options.batching.validate();
  if (options.http_port < 0 || options.http_port > 65535) throw Error("--port must be 0..65535, got " + std::to_string(options.http_port));
  if (options.metrics_port < -1 || options.metrics_port > 65535) {
    throw Error("--metrics-port must be -1 (off: /metrics on the HTTP port) or 0..65535, got " +
                std::to_string(options.metrics_port));
  }
  if (options.grpc_port < -1 || options.grpc_port > 65535) {
    throw Error("--grpc-port must be -1 (off), 0 (a free port) or 1..65535, got " + std::to_string(options.grpc_port));
  }
#ifndef CONVNETS_GRPC
  if (options.grpc_asked && options.grpc_port >= 0) {
    throw Error("--grpc-port: this convnets was built without gRPC (Debian's libgrpc++-dev and protobuf-compiler-grpc; "
                "scripts/setup.sh installs them)");
  }
#endif
  if (options.max_connections < 1 || options.max_connections > 65536) throw Error("--max-connections must be 1 .. 65536");
  if (options.max_json_bytes < 1024) throw Error("--max-json-bytes must be at least 1024");
  if (options.idle_timeout_s < 1 || options.header_timeout_s < 1 || options.body_timeout_s < 1 ||
      options.drain_timeout_s < 0) {
    throw Error("--idle-timeout-s, --header-timeout-s and --body-timeout-s must be at least 1 and --drain-timeout-s "
                "at least 0");
  }
  // Before the models load: a SIGTERM while they do still ends in an orderly stop once the server is up.
  const StopSignals signals;
  raise_descriptor_limit(options.max_connections);
  Server server(options);
  std::atomic<bool> done{false};
  std::thread watcher([&] {
    bool draining = false;
    while (!done) {
      const int sig = signals.wait(100);
      if ((sig == SIGTERM || sig == SIGINT) && !draining) {
        draining = true;
        server.begin_drain(sig == SIGTERM ? "SIGTERM" : "SIGINT");
      }
      if (!draining) continue;
      server.stop_when_drained();
      // A forward pass that never returns would hold the stop for ever: past the drain and the connections'
      // own timeouts, the process ends without them.
      const auto limit = std::chrono::seconds(options.drain_timeout_s + options.idle_timeout_s + options.body_timeout_s +
                                              options.header_timeout_s + 10);
      if (Clock::now() - server.drain_began() > limit) {
        std::fprintf(stderr, "convnets serve: not stopped %lld s after the signal; exiting with requests unanswered\n",
                     static_cast<long long>(limit.count()));
        std::fflush(nullptr);
        std::_Exit(1);
      }
    }
  });
  int rc = 0;
  try {
    rc = server.serve();
  } catch (...) {
    done = true;
    watcher.join();
    throw;
  }
  done = true;
  watcher.join();
  std::fprintf(stderr, "convnets serve: stopped (%s)\n", server.answered().c_str());
  return rc;
}

}  // namespace convnets::serve
