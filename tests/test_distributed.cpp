// Data-parallel pieces with two ranks as threads of one process over real Gloo/TCPStore: equivalence, SyncBN, sharding, launch environment.
#include "core/error.h"
#include "data/sampler.h"
#include "distributed/env.h"
#include "distributed/grad_sync.h"
#include "distributed/group.h"
#include "models/layers.h"
#include "models/registry.h"
#include "train/sgd.h"
#include "train/step.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <iostream>
#include <map>
#include <thread>

namespace convnets {
namespace {

int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

distributed::WorkerEnv worker(int rank, int world, int port) {
  distributed::WorkerEnv e;
  e.rank = rank;
  e.world_size = world;
  e.local_rank = rank;
  e.local_world_size = world;
  e.master_addr = "127.0.0.1";
  e.master_port = port;
  e.source = "test";
  e.timeout = std::chrono::milliseconds(30000);
  return e;
}

// fp64 throughout: fp32 cannot tell a wrong reduction from reordered sums
// here, because the BN biases' gradients are sums of dy that nearly cancel
// (one process with 1 or 2 threads already differs by 1.5% after one step).
Network make_model() {
  torch::manual_seed(0);
  ModelOptions mo;
  mo.num_classes = 10;
  auto m = build_model(find_architecture("resnet8"), mo);
  m->to(torch::kDouble);
  return m;
}

struct Batches {
  std::vector<at::Tensor> images, labels;  // per step, 2B each
};

Batches make_batches(int steps, int global_batch) {
  torch::manual_seed(1);
  Batches b;
  for (int k = 0; k < steps; ++k) {
    b.images.push_back(torch::randn({global_batch, 3, 32, 32}, torch::kDouble));
    b.labels.push_back(torch::randint(0, 10, {global_batch}, torch::kLong));
  }
  return b;
}

constexpr double kLr = 0.2;
const train::SgdOptions kSgd{0.875, false, 1e-3, false};  // weight decay on, as the bar asks

train::StepOptions step_options(runtime::GradientSync* sync) {
  train::StepOptions o;
  o.label_smoothing = 0.1;
  o.sync = sync;
  return o;
}

// Parameters of the reference run after `steps`: one process, the global
// batch as one batch (`micro` = 1) or as `micro` accumulated micro-batches.
std::map<std::string, at::Tensor> reference(const Batches& data, int micro) {
  auto model = make_model();
  train::Sgd sgd(*model, kSgd);
  for (std::size_t k = 0; k < data.images.size(); ++k) {
    std::vector<train::MicroBatch> mb;
    for (const auto& [x, y] : {std::pair{data.images[k].chunk(micro), data.labels[k].chunk(micro)}}) {
      for (int m = 0; m < micro; ++m) mb.push_back({x[m], y[m]});
    }
    train::train_step(*model, sgd, nullptr, nullptr, mb, kLr, static_cast<std::int64_t>(k), step_options(nullptr));
  }
  std::map<std::string, at::Tensor> out;
  for (const auto& p : model->named_parameters()) out[p.key()] = p.value().detach().clone();
  return out;
}

// Two ranks as threads, each with batch B of the global 2B, over a real TCPStore and Gloo.
std::vector<std::map<std::string, at::Tensor>> data_parallel(const Batches& data, bool sync_bn) {
  const int port = free_port();
  std::vector<std::map<std::string, at::Tensor>> out(2);
  std::vector<std::string> errors(2);
  // Built here: torch::manual_seed is process-wide, two threads drawing at once would interleave.
  std::vector<Network> models{make_model(), make_model()};
  auto rank_main = [&](int r) {
    try {
      distributed::Group group(worker(r, 2, port), c10::kCPU, "gloo");
      auto& model = models[static_cast<std::size_t>(r)];
      if (sync_bn) {
        EXPECT_EQ(models::enable_sync_batchnorm(*model, std::shared_ptr<models::BatchNormSync>(&group, [](auto*) {})),
                  9);  // resnet8: stem, 3 blocks x 2, 2 downsample
      }
      train::Sgd sgd(*model, kSgd);
      distributed::GradientReducer reducer(group, sgd.flat(), 1.0 / 16, !sync_bn);  // 64 KiB buckets: several
      reducer.broadcast_state(*model);
      for (std::size_t k = 0; k < data.images.size(); ++k) {
        const auto x = data.images[k].chunk(2)[static_cast<std::size_t>(r)];
        const auto y = data.labels[k].chunk(2)[static_cast<std::size_t>(r)];
        train::train_step(*model, sgd, nullptr, nullptr, {{x, y}}, kLr, static_cast<std::int64_t>(k),
                          step_options(&reducer));
      }
      EXPECT_GT(reducer.stats().buckets, 1);
      for (const auto& p : model->named_parameters()) out[static_cast<std::size_t>(r)][p.key()] = p.value().detach().clone();
    } catch (const std::exception& e) {
      errors[static_cast<std::size_t>(r)] = e.what();
    }
  };
  std::thread t0(rank_main, 0), t1(rank_main, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(errors[0], "");
  EXPECT_EQ(errors[1], "");
  return out;
}

// The bar's measure: per tensor, max |a - b| / max |b|; the worst tensor.
double max_relative_error(const std::map<std::string, at::Tensor>& a, const std::map<std::string, at::Tensor>& b) {
  double worst = 0;
  EXPECT_EQ(a.size(), b.size());
  for (const auto& [k, x] : a) {
    const auto& y = b.at(k);
    worst = std::max(worst, ((x - y).abs().max() / y.abs().max().clamp_min(1e-30)).item<double>());
  }
  return worst;
}

TEST(DataParallel, TwoRanksWithSyncBnEqualOneProcessWithTheDoubleBatch) {
  const auto data = make_batches(4, 16);
  const auto ref = reference(data, 1);
  const auto ranks = data_parallel(data, /*sync_bn=*/true);
  ASSERT_EQ(ranks[0].size(), ref.size());
  const double err = max_relative_error(ranks[0], ref);
  std::cout << "SyncBN, 2 ranks x 8 vs 1 process x 16, 4 steps: max relative error " << err << '\n';
  EXPECT_LT(err, 1e-5);
  EXPECT_EQ(max_relative_error(ranks[0], ranks[1]), 0.0);  // every rank applies the same averaged update
  // The check has teeth: the same run without synchronized BN is a different computation.
  const auto plain = data_parallel(data, /*sync_bn=*/false);
  EXPECT_GT(max_relative_error(plain[0], ref), 1e-3);
}

TEST(DataParallel, TwoRanksWithoutSyncBnEqualOneProcessAccumulatingTheTwoMicroBatches) {
  const auto data = make_batches(4, 16);
  const auto ref = reference(data, 2);
  const auto ranks = data_parallel(data, /*sync_bn=*/false);
  const double err = max_relative_error(ranks[0], ref);
  std::cout << "2 ranks x 8 vs 1 process accumulating 2 x 8, 4 steps: max relative error " << err << '\n';
  EXPECT_LT(err, 1e-5);
  EXPECT_EQ(max_relative_error(ranks[0], ranks[1]), 0.0);
}

// The error of joining as `rank` of `world`, or "" if it joined.
std::string join_error(int rank, int world, int port) {
  try {
    auto e = worker(rank, world, port);
    e.timeout = std::chrono::milliseconds(8000);
    distributed::Group g(e, c10::kCPU, "gloo");
  } catch (const std::exception& ex) {
    return ex.what();
  }
  return "";
}

TEST(DataParallel, RendezvousRejectsAWorldSizeThatDiffersBetweenRanks) {
  const int port = free_port();
  std::string err0, err1;
  std::thread t0([&] { err0 = join_error(0, 2, port); });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  err1 = join_error(1, 3, port);
  t0.join();
  EXPECT_NE(err1.find("rank 1 was started with WORLD_SIZE 3"), std::string::npos) << err1;
  EXPECT_NE(err1.find("with 2"), std::string::npos) << err1;
  // Rank 0 learns it from the store at once instead of waiting out the timeout.
  EXPECT_NE(err0.find("rank 1 failed"), std::string::npos) << err0;
}

// Two ranks as threads of one process, each issuing collectives back to back: their groups' Gloo launches never
// overlap (Group::start serializes them: LibTorch 2.11's ProcessGroupGloo::enqueue raced in c10d's process-wide
// flight recorder), and every sum is right.
TEST(DataParallel, TwoGroupsOfOneProcessLaunchTheirGlooCollectivesOneAtATime) {
  const int port = free_port();
  std::atomic<int> wrong{0};
  auto rank = [&](int r) {
    distributed::Group g(worker(r, 2, port), torch::kCPU, "gloo");
    for (int i = 0; i < 400; ++i) {
      auto t = torch::full({64}, static_cast<double>(r + i), torch::kDouble);
      g.all_reduce_sum(t);
      if (t[0].item<double>() != static_cast<double>(2 * i + 1)) ++wrong;
    }
  };
  std::thread t0(rank, 0), t1(rank, 1);
  t0.join();
  t1.join();
  EXPECT_EQ(wrong.load(), 0);
  EXPECT_EQ(distributed::Group::gloo_launch_peak(), 1) << "two launches overlapped";
}

TEST(Sampler, DealingWholeBatchesGivesEachRankTheGlobalMicroBatchesInTurn) {
  data::ShardOptions o;
  o.shuffle = false;
  o.world_size = 2;
  o.block = 4;
  o.drop_tail = true;
  o.rank = 1;
  const auto r1 = data::shard_indices(21, o, 0);
  EXPECT_EQ(r1, (std::vector<std::int64_t>{4, 5, 6, 7, 12, 13, 14, 15}));  // 21 trimmed to 16
  // Without padding every sample is on exactly one rank (exact evaluation).
  o.block = 1;
  o.drop_tail = false;
  o.pad = false;
  o.world_size = 3;
  std::vector<int> seen(10, 0);
  for (int r = 0; r < 3; ++r) {
    o.rank = r;
    const auto idx = data::shard_indices(10, o, 0);
    EXPECT_EQ(idx.size(), data::shard_size(10, o));
    for (auto i : idx) ++seen[static_cast<std::size_t>(i)];
  }
  EXPECT_EQ(seen, std::vector<int>(10, 1));
}

using Env = std::map<std::string, std::string>;
distributed::Resolved resolve_with(const Env& env, distributed::LaunchOptions flags = {}) {
  return distributed::resolve(flags, [&](const std::string& k) -> std::optional<std::string> {
    auto it = env.find(k);
    if (it == env.end()) return std::nullopt;
    return it->second;
  });
}

TEST(LaunchEnv, TorchrunAndSlurmVariablesGiveTheWorkerItsPlace) {
  auto t = resolve_with({{"RANK", "3"}, {"WORLD_SIZE", "4"}, {"LOCAL_RANK", "1"}, {"LOCAL_WORLD_SIZE", "2"},
                         {"MASTER_ADDR", "node0"}, {"MASTER_PORT", "29400"}});
  EXPECT_EQ(t.role, distributed::Role::Worker);
  EXPECT_EQ(t.worker.rank, 3);
  EXPECT_EQ(t.worker.local_rank, 1);
  EXPECT_EQ(t.worker.master_addr, "node0");
  EXPECT_EQ(t.worker.master_port, 29400);
  auto s = resolve_with({{"SLURM_PROCID", "5"}, {"SLURM_NTASKS", "8"}, {"SLURM_LOCALID", "1"},
                         {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"}, {"SLURM_JOB_NODELIST", "gpu[007-008]"}});
  EXPECT_EQ(s.role, distributed::Role::Worker);
  EXPECT_EQ(s.worker.rank, 5);
  EXPECT_EQ(s.worker.world_size, 8);
  EXPECT_EQ(s.worker.local_world_size, 4);
  EXPECT_EQ(s.worker.master_addr, "gpu007");
  EXPECT_EQ(distributed::first_slurm_host("a1,b[1-3]"), "a1");
  EXPECT_EQ(distributed::first_slurm_host("n[09,12-14]x"), "n09x");
  // A single-task Slurm job stays a single process.
  EXPECT_EQ(resolve_with({{"SLURM_PROCID", "0"}, {"SLURM_NTASKS", "1"}}).role, distributed::Role::Single);
  distributed::LaunchOptions f;
  f.nproc_per_node = 2;
  EXPECT_EQ(resolve_with({}, f).role, distributed::Role::Launcher);
  // The restart count keeps a restarted round's keys apart in torchrun's agent store, which outlives the rounds;
  // in a store rank 0 serves anew each round it would part the ranks of a grown round, whose counts differ.
  const Env restarted = {{"RANK", "1"}, {"WORLD_SIZE", "2"}, {"TORCHELASTIC_RESTART_COUNT", "2"}};
  auto in_agent_store = restarted;
  in_agent_store["TORCHELASTIC_USE_AGENT_STORE"] = "True";
  EXPECT_EQ(resolve_with(in_agent_store).worker.attempt, "2");
  EXPECT_TRUE(resolve_with(in_agent_store).worker.agent_store);
  auto served_anew = restarted;
  served_anew["TORCHELASTIC_USE_AGENT_STORE"] = "False";
  EXPECT_EQ(resolve_with(served_anew).worker.attempt, "0");
  EXPECT_FALSE(resolve_with(served_anew).worker.agent_store);
}

TEST(LaunchEnv, InconsistentLaunchesAreRefusedNamingTheVariable) {
  auto expect_error = [](const Env& env, distributed::LaunchOptions flags, const std::string& part) {
    try {
      resolve_with(env, flags);
      ADD_FAILURE() << "no error, expected: " << part;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(part), std::string::npos) << e.what();
    }
  };
  expect_error({{"RANK", "2"}, {"WORLD_SIZE", "2"}}, {}, "rank 2 is outside WORLD_SIZE 2");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "two"}}, {}, "WORLD_SIZE=two");
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}}, {}, "MASTER_PORT=70000");
  distributed::LaunchOptions f;
  f.nproc_per_node = 2;
  expect_error({{"RANK", "0"}, {"WORLD_SIZE", "3"}}, f, "but WORLD_SIZE is 3");
  f.master_port = 0;
  f.nnodes = 2;
  f.node_rank = 2;
  expect_error({}, f, "--node-rank 2 is not in 0..1");
}

}  // namespace
}  // namespace convnets
