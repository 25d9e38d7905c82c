#include "cli/launch.h"

#include "distributed/launcher.h"

#include <CLI/CLI.hpp>

namespace convnets::cli {

void add_launch_flags(CLI::App* cmd, distributed::LaunchOptions& o) {
  const auto last = CLI::MultiOptionPolicy::TakeLast;
  const std::string group = "Data-parallel launch (torchrun's flags)";
  cmd->add_option("--nproc-per-node,--nproc_per_node", o.nproc_per_node, "worker processes on this machine (one per GPU)")
      ->group(group)->multi_option_policy(last);
  cmd->add_option("--nnodes", o.nnodes, "machines in the job [default 1]")->group(group)->multi_option_policy(last);
  cmd->add_option("--node-rank,--node_rank", o.node_rank, "this machine's index, 0..nnodes-1 [default 0]")
      ->group(group)->multi_option_policy(last);
  cmd->add_option("--master-addr,--master_addr", o.master_addr, "address of node 0, where rank 0 serves the rendezvous store "
                                                  "[default MASTER_ADDR, else 127.0.0.1]")
      ->group(group)->multi_option_policy(last);
  cmd->add_option("--master-port,--master_port", o.master_port, "its TCP port [default MASTER_PORT, else 29500]")
      ->group(group)->multi_option_policy(last);
  cmd->add_option("--dist-timeout", o.timeout_s,
                  "seconds the rendezvous and each collective may take before the ranks give up and name the rank "
                  "at fault [default 300]")
      ->group(group)->multi_option_policy(last);
}

int launch_or_run(const distributed::LaunchOptions& options, const std::function<int(const distributed::WorkerEnv*)>& work) {
  const auto resolved = distributed::resolve(options);
  switch (resolved.role) {
    case distributed::Role::Launcher:
      // Survivors of a failed rank need up to the timeout to diagnose it and exit on their own.
      return distributed::launch_workers(resolved.worker, distributed::program_args(), options.timeout_s + 15);
    case distributed::Role::Worker:
      return work(&resolved.worker);
    case distributed::Role::Single:
      break;
  }
  return work(nullptr);
}

}  // namespace convnets::cli
