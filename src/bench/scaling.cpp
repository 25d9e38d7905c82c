#include "bench/scaling.h"

#include "core/error.h"
#include "core/json.h"
#include "distributed/launcher.h"

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>
#include <vector>

namespace convnets::bench {
namespace {

nlohmann::json read_json(const std::string& path) {
  if (!std::ifstream(path)) throw Error("bench: the workers left no results in " + path);
  return read_json_file(path, "bench worker results");
}

}  // namespace

ScalingReport run_scaling(const distributed::WorkerEnv& plan, double timeout_s) {
  if (plan.world_size != plan.local_world_size) {
    throw Error("bench train measures one machine: leave out --nnodes", "run `convnets train` across machines");
  }
  char pattern[] = "/tmp/convnets-bench-XXXXXX";
  if (!::mkdtemp(pattern)) throw SystemError("bench: cannot create a folder", pattern);
  const std::string dir = pattern;
  const std::string one = dir + "/one.json", many = dir + "/many.json";
  const double grace = timeout_s;
  distributed::WorkerEnv single = plan;
  single.local_world_size = single.world_size = 1;
  // The lone process gets one worker's share of the CPU threads (as each GPU
  // process has its own GPU), so the efficiency measures what communication costs.
  std::vector<std::pair<std::string, std::string>> env{{kBenchOut, one}};
  if (!std::getenv("OMP_NUM_THREADS")) {
    const unsigned cpus = std::max(1u, std::thread::hardware_concurrency());
    env.emplace_back("OMP_NUM_THREADS", std::to_string(std::max(1u, cpus / static_cast<unsigned>(plan.world_size))));
  }
  int rc = distributed::launch_workers(single, distributed::program_args(), grace, env);
  if (rc == 0) {
    rc = distributed::launch_workers(plan, distributed::program_args(), grace, {{kBenchOut, many}, {kBenchGroup, "1"}});
  }
  if (rc != 0) {
    std::filesystem::remove_all(dir);
    throw Error("bench train: a worker failed (exit code " + std::to_string(rc) + "); its error is above");
  }
  auto j1 = read_json(one), jn = read_json(many);
  std::filesystem::remove_all(dir);
  const int n = plan.world_size;
  std::ostringstream out;
  out << "convnets bench train: " << jn["arch"].get<std::string>() << ", " << jn["precision"].get<std::string>()
            << ", " << jn["image_size"] << "px, " << jn["device"].get<std::string>() << ", " << n
            << (n == 1 ? " process" : " processes") << " (data-parallel) vs 1, LibTorch " << jn["torch_version"].get<std::string>() << "\n\n"
            << "| Batch/process | img/s per process | Total img/s | 1 process img/s | Scaling efficiency | "
               "All-reduce/step (MiB) | Buckets | Exposed comm (ms/step) |\n"
            << "|---:|---:|---:|---:|---:|---:|---:|---:|\n";
  for (std::size_t i = 0; i < jn["rows"].size(); ++i) {
    auto& r = jn["rows"][i];
    const auto& s = j1["rows"][i];
    if (!r.value("fits", false) || !s.value("fits", false)) {
      out << "| " << r["batch"] << " | out of memory |\n";
      continue;
    }
    const double base = s["images_per_s"].get<double>(), total = r["total_images_per_s"].get<double>();
    r["single_process_images_per_s"] = base;
    r["scaling_efficiency"] = total / (n * base);
    char line[256];
    std::snprintf(line, sizeof line, "| %lld | %.1f | %.1f | %.1f | %.1f%% | %.1f | %lld | %.2f |\n",
                  r["batch"].get<long long>(), r["images_per_s"].get<double>(), total, base,
                  100.0 * total / (n * base), r.value("allreduce_mb", 0.0), r.value("buckets", 0LL),
                  r.value("comm_wait_ms", 0.0));
    out << line;
  }
  return {jn, out.str()};
}


}  // namespace convnets::bench
