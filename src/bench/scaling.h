// `bench train --nproc-per-node N`: the same synthetic step timed by one process alone, then by N together on one machine; scaling efficiency = total / (N x one alone).
#pragma once

#include "distributed/env.h"

#include <nlohmann/json.hpp>

#include <string>

namespace convnets::bench {

// Where a bench worker started by run_scaling leaves its JSON record.
inline constexpr const char* kBenchOut = "CONVNETS_BENCH_OUT";
// Set for the data-parallel leg: its workers form a process group even when there is one of them, so that
// `--nproc-per-node 1` measures the gradient all-reduce on NCCL against the lone process (as DDP on one GPU does)
// rather than running the lone process twice. The GPU machine's first run showed 0 buckets there.
inline constexpr const char* kBenchGroup = "CONVNETS_BENCH_GROUP";

struct ScalingReport {
  nlohmann::json record;  // the data-parallel leg's, each row with the lone process's images/s and the efficiency
  std::string table;
};

// Starts this program again (distributed::program_args()) as `plan`'s workers, first one alone (with one worker's
// share of the CPU threads, as each GPU process has its own GPU), then all of them; each leg may take `timeout_s`.
// Throws Error where a worker failed or `plan` spans machines.
ScalingReport run_scaling(const distributed::WorkerEnv& plan, double timeout_s);

}  // namespace convnets::bench
