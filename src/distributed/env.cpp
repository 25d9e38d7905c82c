#include "distributed/env.h"

#include "core/error.h"

#include <cstdlib>

namespace convnets::distributed {
namespace {

using Getenv = std::function<std::optional<std::string>(const std::string&)>;

std::optional<std::string> real_getenv(const std::string& name) {
  const char* v = std::getenv(name.c_str());
  if (!v) return std::nullopt;
  return std::string(v);
}

int parse_int(const std::string& name, const std::string& text, int lo, int hi) {
  std::size_t used = 0;
  long v = 0;
  try {
    v = std::stol(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used == 0 || used != text.size() || v < lo || v > hi) {
    throw Error(name + "=" + text + ": expected an integer in " + std::to_string(lo) + ".." + std::to_string(hi));
  }
  return static_cast<int>(v);
}

int env_int(const Getenv& env, const std::string& name, int lo, int hi, std::optional<int> fallback = std::nullopt) {
  const auto v = env(name);
  if (!v) {
    if (fallback) return *fallback;
    throw Error(name + " is not set", "torchrun sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT");
  }
  return parse_int(name, *v, lo, hi);
}

// Slurm's SLURM_TASKS_PER_NODE / SLURM_STEP_TASKS_PER_NODE: "4(x2),3" -> tasks on the first node.
std::optional<int> first_tasks_per_node(const std::optional<std::string>& text) {
  if (!text || text->empty()) return std::nullopt;
  std::size_t end = text->find_first_of("(,");
  try {
    return std::stoi(text->substr(0, end));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

}  // namespace

std::string first_slurm_host(const std::string& nodelist) {
  // Hosts are separated by commas outside brackets; a bracket holds ranges.
  std::string first;
  int depth = 0;
  for (char ch : nodelist) {
    if (ch == '[') ++depth;
    if (ch == ']') --depth;
    if (ch == ',' && depth == 0) break;
    first += ch;
  }
  const auto open = first.find('[');
  if (open == std::string::npos) return first;
  const auto close = first.find(']', open);
  if (close == std::string::npos) throw Error("Slurm node list '" + nodelist + "': unbalanced '['");
  std::string range = first.substr(open + 1, close - open - 1);
  range = range.substr(0, range.find(','));
  range = range.substr(0, range.find('-'));  // the first number keeps its zero padding
  return first.substr(0, open) + range + first.substr(close + 1);
}

Resolved resolve(const LaunchOptions& flags, const Getenv& getenv_in) {
  const Getenv env = getenv_in ? getenv_in : Getenv(real_getenv);
  if (flags.nproc_per_node < 0) throw Error("--nproc-per-node must be at least 1");
  if (flags.nnodes < 1) throw Error("--nnodes must be at least 1");
  if (flags.node_rank < 0 || flags.node_rank >= flags.nnodes) {
    throw Error("--node-rank " + std::to_string(flags.node_rank) + " is not in 0.." + std::to_string(flags.nnodes - 1) +
                " for --nnodes " + std::to_string(flags.nnodes));
  }
  if (flags.master_port != 0 && (flags.master_port < 1 || flags.master_port > 65535)) {
    throw Error("--master-port " + std::to_string(flags.master_port) + ": expected a TCP port in 1..65535");
  }
  if (!(flags.timeout_s > 0)) throw Error("--dist-timeout must be positive (seconds)");

  Resolved r;
  WorkerEnv& w = r.worker;
  w.timeout = std::chrono::milliseconds(static_cast<std::int64_t>(flags.timeout_s * 1000));
  const auto rank_env = env("RANK");
  const auto slurm_ntasks = env("SLURM_NTASKS");
  const bool slurm = !rank_env && env("SLURM_PROCID") && slurm_ntasks &&
                     parse_int("SLURM_NTASKS", *slurm_ntasks, 1, 1 << 20) > 1;
  if (rank_env) {
    w.world_size = env_int(env, "WORLD_SIZE", 1, 1 << 20);
    w.rank = parse_int("RANK", *rank_env, 0, 1 << 20);
    w.local_rank = env_int(env, "LOCAL_RANK", 0, 1 << 20, 0);
    w.local_world_size = env_int(env, "LOCAL_WORLD_SIZE", 1, 1 << 20, 1);
    w.node_rank = env_int(env, "GROUP_RANK", 0, 1 << 20, 0);
    const auto launched = env("CONVNETS_LAUNCHER");
    w.source = launched ? "convnets launcher" : "torchrun environment";
    w.agent_store = env("TORCHELASTIC_USE_AGENT_STORE").value_or("") == "True";
    // The agent's store outlives its rounds, so a restarted round's keys take its count. A store that rank 0
    // serves anew each round (TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1, which growing a job needs) takes none: an
    // agent that joined later counts only its own restarts, and one key for two counts would never meet.
    if (w.agent_store) w.attempt = env("TORCHELASTIC_RESTART_COUNT").value_or("0");
  } else if (slurm) {
    w.world_size = parse_int("SLURM_NTASKS", *slurm_ntasks, 1, 1 << 20);
    w.rank = env_int(env, "SLURM_PROCID", 0, 1 << 20);
    w.local_rank = env_int(env, "SLURM_LOCALID", 0, 1 << 20, 0);
    w.node_rank = env_int(env, "SLURM_NODEID", 0, 1 << 20, 0);
    auto per_node = first_tasks_per_node(env("SLURM_STEP_TASKS_PER_NODE"));
    if (!per_node) per_node = first_tasks_per_node(env("SLURM_TASKS_PER_NODE"));
    w.local_world_size = per_node.value_or(1);
    w.source = "Slurm (srun)";
  } else if (flags.nproc_per_node > 0 || flags.nnodes > 1) {
    r.role = Role::Launcher;
    w.local_world_size = std::max(flags.nproc_per_node, 1);
    w.world_size = w.local_world_size * flags.nnodes;
    w.node_rank = flags.node_rank;
    w.rank = flags.node_rank * w.local_world_size;
    w.source = "convnets launcher";
  } else {
    return r;  // Role::Single
  }

  // Flags beat the environment for the rendezvous address, as with torchrun.
  if (!flags.master_addr.empty()) {
    w.master_addr = flags.master_addr;
  } else if (auto a = env("MASTER_ADDR")) {
    w.master_addr = *a;
  } else if (slurm) {
    const auto list = env("SLURM_STEP_NODELIST") ? env("SLURM_STEP_NODELIST") : env("SLURM_JOB_NODELIST");
    if (!list) throw Error("Slurm: neither MASTER_ADDR nor SLURM_JOB_NODELIST is set; cannot find the first node");
    w.master_addr = first_slurm_host(*list);
  }
  if (flags.master_port != 0) {
    w.master_port = flags.master_port;
  } else if (auto p = env("MASTER_PORT")) {
    w.master_port = parse_int("MASTER_PORT", *p, 1, 65535);
  }
  if (w.master_addr.empty()) throw Error("--master-addr is empty");

  if (r.role == Role::Launcher) return r;
  r.role = Role::Worker;
  const std::string where = " (" + w.source + ")";
  if (w.rank >= w.world_size) {
    throw Error("rank " + std::to_string(w.rank) + " is outside WORLD_SIZE " + std::to_string(w.world_size) + where,
                "every rank must be in 0..WORLD_SIZE-1");
  }
  if (w.local_rank >= w.local_world_size) {
    throw Error("LOCAL_RANK " + std::to_string(w.local_rank) + " is outside LOCAL_WORLD_SIZE " +
                std::to_string(w.local_world_size) + where);
  }
  if (w.local_world_size > w.world_size) {
    throw Error("LOCAL_WORLD_SIZE " + std::to_string(w.local_world_size) + " exceeds WORLD_SIZE " +
                std::to_string(w.world_size) + where);
  }
  // A worker of torchrun or srun that was also given launch flags must agree
  // with them (our own launcher sets the variables from those flags, except
  // for bench's one-process baseline).
  if (w.source != "convnets launcher" && flags.nproc_per_node > 0 && flags.nproc_per_node * flags.nnodes != w.world_size) {
    throw Error("--nproc-per-node " + std::to_string(flags.nproc_per_node) + " x --nnodes " +
                    std::to_string(flags.nnodes) + " = " + std::to_string(flags.nproc_per_node * flags.nnodes) +
                    " processes, but WORLD_SIZE is " + std::to_string(w.world_size) + where,
                "under torchrun or srun, leave out --nproc-per-node and --nnodes");
  }
  return r;
}

}  // namespace convnets::distributed
