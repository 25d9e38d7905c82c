// Who this process is in a distributed run: launcher flags, torchrun's and Slurm's environment, and their consistency checks.
#pragma once

#include <chrono>
#include <functional>
#include <optional>
#include <string>

namespace convnets::distributed {

// The launch flags shared by `train` and `bench train` (torchrun's names).
struct LaunchOptions {
  int nproc_per_node = 0;  // 0: not given
  int nnodes = 1;
  int node_rank = 0;
  std::string master_addr;  // empty: MASTER_ADDR, else 127.0.0.1
  int master_port = 0;      // 0: MASTER_PORT, else 29500
  double timeout_s = 300;   // rendezvous and every collective
};

// One worker's place in the job.
struct WorkerEnv {
  int rank = 0, world_size = 1;
  int local_rank = 0, local_world_size = 1;
  int node_rank = 0;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  // torchrun >= 2.x hosts the store itself on MASTER_PORT and says so here;
  // then rank 0 connects as a client instead of serving.
  bool agent_store = false;
  std::string attempt = "0";  // TORCHELASTIC_RESTART_COUNT with the agent's store: keys of a restart do not collide
  std::string source;  // "convnets launcher", "torchrun environment", "Slurm (srun)"
  std::chrono::milliseconds timeout{300000};
};

enum class Role { Single, Launcher, Worker };

struct Resolved {
  Role role = Role::Single;
  WorkerEnv worker;  // Role::Worker
};

// Reads RANK/WORLD_SIZE/... (torchrun, or our launcher) first, then Slurm's
// SLURM_PROCID/SLURM_NTASKS/... when SLURM_NTASKS > 1; otherwise launcher
// flags make this process the launcher. Any inconsistency (RANK outside
// WORLD_SIZE, flags that disagree with the environment, a port outside
// 1..65535) throws Error naming the variable or flag. `getenv` is injectable
// for tests.
Resolved resolve(const LaunchOptions& flags,
                 const std::function<std::optional<std::string>(const std::string&)>& getenv = {});

// The first host of a Slurm node list: "gpu[003-005,9],cpu1" -> "gpu003".
std::string first_slurm_host(const std::string& nodelist);

}  // namespace convnets::distributed
