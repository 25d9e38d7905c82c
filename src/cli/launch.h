// The launch flags of data-parallel commands (--nproc-per-node, --nnodes, ...) and the launcher-or-worker decision.
#pragma once

#include "distributed/env.h"

#include <functional>

namespace CLI {
class App;
}

namespace convnets::cli {

void add_launch_flags(CLI::App* cmd, distributed::LaunchOptions& options);

// As torchrun: the launcher starts this node's workers and returns their
// combined exit code; a worker (or a single process) runs `work` with its
// place in the job (nullptr: a single process).
int launch_or_run(const distributed::LaunchOptions& options, const std::function<int(const distributed::WorkerEnv*)>& work);

}  // namespace convnets::cli
