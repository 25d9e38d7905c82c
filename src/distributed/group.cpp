#include "distributed/group.h"

#include "distributed/backend.h"

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#include <torch/torch.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <map>
#include <mutex>
#include <sstream>
#include <vector>

namespace convnets::distributed {
namespace {

using clock = std::chrono::steady_clock;
using WorkPtr = c10::intrusive_ptr<c10d::Work>;

std::vector<std::uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }
std::string text(const std::vector<std::uint8_t>& b) { return {b.begin(), b.end()}; }

std::string message_of(const std::exception& e) {
  if (const auto* c = dynamic_cast<const c10::Error*>(&e)) return c->what_without_backtrace();
  return e.what();
}

std::string seconds(std::chrono::milliseconds ms) {
  std::ostringstream o;
  o << static_cast<double>(ms.count()) / 1000.0 << " s";
  return o.str();
}

struct Addresses {
  std::vector<sockaddr_storage> all;
  bool loopback = true;
};

Addresses resolve_host(const WorkerEnv& env) {
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* found = nullptr;
  const int rc = ::getaddrinfo(env.master_addr.c_str(), nullptr, &hints, &found);
  if (rc != 0) {
    throw DistributedError("master address '" + env.master_addr + "' (--master-addr / MASTER_ADDR) does not resolve: " +
                               ::gai_strerror(rc),
                           "give node 0's host name or IP address");
  }
  Addresses out;
  for (auto* a = found; a; a = a->ai_next) {
    sockaddr_storage s{};
    std::memcpy(&s, a->ai_addr, a->ai_addrlen);
    out.all.push_back(s);
    if (a->ai_family == AF_INET) {
      const auto* in = reinterpret_cast<const sockaddr_in*>(a->ai_addr);
      out.loopback = out.loopback && (ntohl(in->sin_addr.s_addr) >> 24) == 127;
    } else if (a->ai_family == AF_INET6) {
      const auto* in6 = reinterpret_cast<const sockaddr_in6*>(a->ai_addr);
      out.loopback = out.loopback && IN6_IS_ADDR_LOOPBACK(&in6->sin6_addr);
    }
  }
  ::freeaddrinfo(found);
  return out;
}

// Whether this machine owns one of the addresses: binding to it succeeds.
bool is_local(const Addresses& a) {
  for (const auto& s : a.all) {
    const int fd = ::socket(s.ss_family, SOCK_STREAM, 0);
    if (fd < 0) continue;
    sockaddr_storage copy = s;  // port 0: any free port
    const socklen_t len = s.ss_family == AF_INET ? sizeof(sockaddr_in) : sizeof(sockaddr_in6);
    const bool ok = ::bind(fd, reinterpret_cast<sockaddr*>(&copy), len) == 0;
    ::close(fd);
    if (ok) return true;
  }
  return false;
}

}  // namespace

std::string resolve_backend(const std::string& backend, const c10::Device& device) {
  if (backend == "auto") return device.is_cuda() ? "nccl" : "gloo";
  if (backend == "gloo") return backend;
  if (backend == "nccl") {
    if (device.is_cuda()) return backend;
    throw Error("--dist-backend nccl: no CUDA device: NCCL moves tensors between GPUs, and this run is on the CPU" +
                    std::string(torch::cuda::is_available() ? " (--device cpu)" : " (no GPU is visible)"),
                "use --dist-backend gloo (or auto) on the CPU");
  }
  throw Error("--dist-backend " + backend + ": expected auto, gloo or nccl");
}

bool check_master_address(const WorkerEnv& env, bool serves_store) {
  const Addresses addr = resolve_host(env);
  if (serves_store && !is_local(addr)) {
    throw DistributedError("master address '" + env.master_addr +
                               "' (--master-addr / MASTER_ADDR) is not an address of this machine, but rank 0 "
                               "runs here and serves the rendezvous store on it",
                           "on node 0, give one of its own addresses (or 127.0.0.1 for a single machine)");
  }
  return addr.loopback;
}

class Group::Pending {
 public:
  WorkPtr work;
  std::string what;
  at::Tensor staged, target;  // a copy on the backend's device, and where its result goes back
};

struct Group::Impl {
  std::string prefix;  // convnets/<attempt>/
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::Backend> backend;
  c10::Device device{c10::kCPU};  // where the backend's collectives run (NCCL: this rank's GPU)
  std::string key(const std::string& k) const { return prefix + k; }
};

namespace {

c10::intrusive_ptr<c10d::TCPStore> open_store(const WorkerEnv& env, bool server, std::chrono::milliseconds timeout) {
  c10d::TCPStoreOptions o;
  o.port = static_cast<std::uint16_t>(env.master_port);
  o.isServer = server;
  o.waitWorkers = false;
  o.timeout = timeout;
  try {
    return c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    const std::string where = env.master_addr + ":" + std::to_string(env.master_port);
    if (server) {
      throw DistributedError("rank 0 cannot serve the rendezvous store on port " + std::to_string(env.master_port) +
                                 " (--master-port / MASTER_PORT): " + message_of(e),
                             "the port is in use (another job, or a rank 0 started twice); pick another --master-port");
    }
    throw DistributedError("rank " + std::to_string(env.rank) + " could not reach the rendezvous store at " + where +
                               " within " + seconds(timeout) + ": " + message_of(e),
                           "start node 0 (rank 0) too, and check --master-addr, --master-port and the firewall");
  }
}

}  // namespace

Group::Group(const WorkerEnv& env, const c10::Device& device, const std::string& backend)
    : env_(env), impl_(new Impl) {
  // A peer that dies mid-collective closes its sockets; a write to one then raises SIGPIPE, whose default ends this
  // rank without a word (distributed_cli saw rank 0 "killed by signal 13" once, 2026-11-27). Ignored, the write
  // fails with EPIPE and the collective's error reaches the diagnosis below, which names the rank that stopped.
  std::signal(SIGPIPE, SIG_IGN);
  impl_->prefix = "convnets/" + env.attempt + "/";
  backend_ = resolve_backend(backend, device);
  impl_->device = backend_ == "nccl" ? device : c10::Device(c10::kCPU);
  const bool serve = env.rank == 0 && !env.agent_store;
  const bool loopback = check_master_address(env, serve);
  impl_->store = open_store(env, serve, env.timeout);
  auto& store = *impl_->store;
  const int w = env.world_size, r = env.rank;
  const std::string source = " (" + env.source + ")";
  try {
    // Every rank must agree on the world size; the first to arrive sets it.
    const auto agreed = text(store.compareSet(impl_->key("world_size"), {}, bytes(std::to_string(w))));
    if (agreed != std::to_string(w)) {
      const std::string msg = "rank " + std::to_string(r) + " was started with WORLD_SIZE " + std::to_string(w) +
                              source + ", but the job's other ranks with " + agreed;
      publish_failure(msg);
      throw DistributedError(msg, "start every rank with the same --nproc-per-node x --nnodes (WORLD_SIZE)");
    }
    if (store.add(impl_->key("rank/" + std::to_string(r)), 1) > 1) {
      const std::string msg = "rank " + std::to_string(r) + " was started twice" + source;
      publish_failure(msg);
      throw DistributedError(msg, "give each process its own RANK (node ranks and LOCAL_RANKs must not repeat)");
    }
    store.add(impl_->key("arrived"), 1);
    const auto deadline = clock::now() + env.timeout;
    for (int poll = 0;; ++poll) {
      if (store.add(impl_->key("arrived"), 0) >= w) break;
      if (poll % 5 == 0) {
        for (int o = 0; o < w; ++o) {
          const auto k = impl_->key("error/" + std::to_string(o));
          if (o != r && store.check({k})) {
            throw DistributedError("rendezvous failed: rank " + std::to_string(o) + " failed: " + text(store.get(k)));
          }
        }
      }
      if (clock::now() > deadline) {
        std::vector<std::string> missing;
        for (int o = 0; o < w; ++o) {
          if (!store.check({impl_->key("rank/" + std::to_string(o))})) missing.push_back(std::to_string(o));
        }
        throw DistributedError("rendezvous timed out after " + seconds(env.timeout) + ": rank(s) " + join(missing) +
                                   " of WORLD_SIZE " + std::to_string(w) + " never joined",
                               "start every rank (is WORLD_SIZE larger than the processes launched?), or raise --dist-timeout");
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    // Each backend connects through its own prefix of the same store.
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(impl_->key(backend_), impl_->store);
    impl_->backend = backend_ == "nccl" ? make_nccl_backend(prefixed, r, w, env.timeout, device)
                                        : make_gloo_backend(prefixed, r, w, env.timeout, loopback);
  } catch (const DistributedError&) {
    throw;
  } catch (const std::exception& e) {
    throw DistributedError("rendezvous of rank " + std::to_string(r) + " at " + env.master_addr + ":" +
                           std::to_string(env.master_port) + " failed: " + message_of(e));
  }
  heartbeat_ = std::thread([this] { heartbeat_loop(); });
}

Group::~Group() {
  stop_.store(true);
  if (heartbeat_.joinable()) heartbeat_.join();
}

void Group::heartbeat_loop() {
  // A connection of its own, so a heartbeat never queues behind a blocked call.
  c10::intrusive_ptr<c10d::TCPStore> store;
  const auto interval = std::chrono::milliseconds(500);
  std::int64_t beats = 0;
  while (!stop_.load()) {
    try {
      if (!store) store = open_store(env_, false, std::chrono::milliseconds(5000));
      store->set(impl_->key("hb/" + std::to_string(env_.rank)),
                 bytes(std::to_string(++beats) + " " + std::to_string(step_.load())));
    } catch (const std::exception&) {
      store.reset();  // the store's host is gone; diagnose() says so
    }
    for (auto t = std::chrono::milliseconds(0); t < interval && !stop_.load(); t += std::chrono::milliseconds(50)) {
      std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
  }
}

void Group::publish_failure(const std::string& message) noexcept {
  try {
    if (impl_ && impl_->store) impl_->store->set(impl_->key("error/" + std::to_string(env_.rank)), bytes(message));
  } catch (...) {
  }
}

std::string Group::diagnose() {
  const int w = env_.world_size, me = env_.rank;
  c10::intrusive_ptr<c10d::TCPStore> store;
  try {
    store = open_store(env_, false, std::chrono::milliseconds(5000));
  } catch (const std::exception&) {
    if (me != 0 && !env_.agent_store) {
      return "rank 0 is gone: the rendezvous store it served at " + env_.master_addr + ":" +
             std::to_string(env_.master_port) + " no longer answers (its process exited or its machine is unreachable)";
    }
    return "";
  }
  std::vector<std::string> found;
  for (int o = 0; o < w; ++o) {
    const auto k = impl_->key("error/" + std::to_string(o));
    if (o != me && store->check({k})) found.push_back("rank " + std::to_string(o) + " failed: " + text(store->get(k)));
  }
  if (!found.empty()) return join(found, "; ");
  auto read = [&] {
    std::map<int, std::pair<std::int64_t, std::int64_t>> hb;  // rank -> (beats, step)
    for (int o = 0; o < w; ++o) {
      const auto k = impl_->key("hb/" + std::to_string(o));
      if (o == me || !store->check({k})) continue;
      std::istringstream in(text(store->get(k)));
      std::int64_t beats = 0, step = 0;
      in >> beats >> step;
      hb[o] = {beats, step};
    }
    return hb;
  };
  try {
    const auto before = read();
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
    const auto after = read();
    for (int o = 0; o < w; ++o) {
      if (o == me) continue;
      const auto b = before.find(o), a = after.find(o);
      if (a == after.end() || (b != before.end() && b->second.first == a->second.first)) {
        found.push_back("rank " + std::to_string(o) + " stopped responding (no heartbeat for 2 s" +
                        (a != after.end() ? ", last seen at step " + std::to_string(a->second.second) : "") +
                        "): it died or is frozen");
      }
    }
    if (!found.empty()) return join(found, "; ");
    for (const auto& [o, v] : after) {
      if (v.second < step_.load()) {
        found.push_back("rank " + std::to_string(o) + " is alive but stuck at step " + std::to_string(v.second) +
                        " (this rank is at step " + std::to_string(step_.load()) + ")");
      }
    }
  } catch (const std::exception&) {
    if (me != 0) return "rank 0 is gone: the rendezvous store it served stopped answering";
  }
  return join(found, "; ");
}

void Group::fail(const std::string& what, const std::string& cause) {
  const std::string why = diagnose();
  std::string msg = "distributed run: " + what + " failed on rank " + std::to_string(env_.rank) + " at step " +
                    std::to_string(step_.load()) + ": ";
  msg += why.empty() ? cause : why + "\n  (" + cause.substr(0, cause.find('\n')) + ")";
  throw DistributedError(msg, "the last complete checkpoint is intact; continue with --resume (any world size)");
}

namespace {

std::atomic<int> gloo_launching{0}, gloo_peak{0};

// Counts a Gloo launch in flight while it lives: what gloo_launch_peak() reports.
struct LaunchCount {
  explicit LaunchCount(bool gloo) : gloo_(gloo) {
    if (!gloo_) return;
    const int now = ++gloo_launching;
    for (int peak = gloo_peak.load(); now > peak && !gloo_peak.compare_exchange_weak(peak, now);) {
    }
  }
  ~LaunchCount() {
    if (gloo_) --gloo_launching;
  }
  LaunchCount(const LaunchCount&) = delete;
  LaunchCount& operator=(const LaunchCount&) = delete;

 private:
  bool gloo_;
};

}  // namespace

int Group::gloo_launch_peak() { return gloo_peak.load(); }

std::shared_ptr<Group::Pending> Group::start(const char* what, const std::function<void(Pending&)>& launch) {
  auto p = std::make_shared<Pending>();
  p->what = what;
  try {
    // ProcessGroupGloo::enqueue (LibTorch 2.11) records each collective in c10d's process-wide flight recorder:
    // two groups of one process enqueuing at once (the tests' ranks as threads) crashed in a std::map insert
    // under that call (the preflight of 2026-11-28), a race between the groups. Enqueues are serialized instead.
    // One group per process, as a real run has, never waits here; the enqueue returns at once, and the wait for
    // the peers is outside the lock.
    static std::mutex gloo_enqueue;
    std::unique_lock<std::mutex> lock(gloo_enqueue, std::defer_lock);
    if (backend_ == "gloo") lock.lock();
    const LaunchCount counted(backend_ == "gloo");
    launch(*p);
  } catch (const std::exception& e) {
    fail(what, message_of(e));
  }
  return p;
}

at::Tensor Group::on_backend_device(const at::Tensor& t) const {
  // NCCL moves CUDA tensors only; Gloo takes host and CUDA tensors alike.
  return backend_ == "nccl" && t.device() != impl_->device ? t.to(impl_->device) : t;
}

std::shared_ptr<Group::Pending> Group::all_reduce_async(const at::Tensor& t, const char* what) {
  return start(what, [&](Pending& p) {
    p.staged = on_backend_device(t);
    if (!p.staged.is_same(t)) p.target = t;
    std::vector<at::Tensor> v{p.staged};
    p.work = impl_->backend->allreduce(v);
  });
}

void Group::wait(Pending& p) {
  try {
    p.work->wait();
  } catch (const std::exception& e) {
    fail(p.what, message_of(e));
  }
  if (p.target.defined()) p.target.copy_(p.staged);
}

void Group::all_reduce_sum(at::Tensor& t) { wait(*all_reduce_async(t, "all-reduce")); }

at::Tensor Group::all_gather(const at::Tensor& t) {
  std::vector<at::Tensor> in{on_backend_device(t.contiguous())};
  std::vector<std::vector<at::Tensor>> out(1);
  for (int i = 0; i < world_size(); ++i) out[0].push_back(torch::empty_like(in[0]));
  wait(*start("all-gather", [&](Pending& p) { p.work = impl_->backend->allgather(out, in); }));
  return torch::stack(out[0]).to(t.device());
}

void Group::broadcast(at::Tensor& t, int root) {
  wait(*start("broadcast", [&](Pending& p) {
    p.staged = on_backend_device(t);
    if (!p.staged.is_same(t)) p.target = t;
    std::vector<at::Tensor> v{p.staged};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    p.work = impl_->backend->broadcast(v, o);
  }));
}

bool Group::any(bool flag) {
  auto t = torch::full({1}, flag ? 1 : 0, torch::kLong);
  all_reduce_sum(t);
  return t.item<std::int64_t>() > 0;
}

}  // namespace convnets::distributed
