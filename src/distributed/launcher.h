// The local launcher: starts this node's worker processes with torchrun's environment and watches them.
#pragma once

#include "distributed/env.h"

#include <string>
#include <utility>
#include <vector>

namespace convnets::distributed {

// The command line this process was started with (main() records it), which
// the launcher runs again once per worker.
void set_program_args(int argc, char** argv);
const std::vector<std::string>& program_args();

// torchrun's job on one node: `plan.local_world_size` copies of this binary
// with RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK,
// MASTER_ADDR and MASTER_PORT set (plus `extra_env`), and OMP_NUM_THREADS =
// CPUs / workers unless already set. Node 0 first checks that the master port
// is free. SIGINT/SIGTERM are passed on. When a worker fails, the others get
// `grace_s` to notice and exit with their own diagnosis, then are terminated.
// Returns 0 when every worker succeeded, else the first failure's exit code
// (128 + signal for a killed worker).
int launch_workers(const WorkerEnv& plan, const std::vector<std::string>& argv, double grace_s,
                   const std::vector<std::pair<std::string, std::string>>& extra_env = {});

}  // namespace convnets::distributed
