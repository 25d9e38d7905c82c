#include "train/world_change.h"

#include <cmath>
#include <sstream>

namespace convnets::train {

BatchSplit split_global_batch(std::int64_t global, std::int64_t max_batch, std::int64_t world) {
  BatchSplit s;
  if (global < 1 || max_batch < 1 || world < 1) return s;
  for (std::int64_t m = 1; m <= global / world; ++m) {
    if (global % (world * m) == 0 && global / (world * m) <= max_batch) return {global / (world * m), m, global, true};
  }
  // No equal split: as many micro-batches as the memory bound needs, each of the size that comes nearest.
  s.micro_batches = (global + world * max_batch - 1) / (world * max_batch);
  const double ideal = static_cast<double>(global) / static_cast<double>(world * s.micro_batches);
  s.batch = std::max<std::int64_t>(1, std::min<std::int64_t>(max_batch, std::llround(ideal)));
  s.global = s.batch * s.micro_batches * world;
  return s;
}

std::int64_t checkpoint_images_per_step(const nlohmann::json& meta) {
  const auto& old = meta.at("config");
  const std::int64_t old_obs = old.value("optimizer_batch_size", std::int64_t{0});
  return meta.value("images_per_step", old_obs > 0 ? old_obs
                                                   : old.value("batch_size", std::int64_t{0}) *
                                                         meta.value("world_size", std::int64_t{1}));
}

std::string keep_images_per_step(TrainConfig& c, const nlohmann::json& meta, std::int64_t world) {
  if (c.resume_batch != "recipe" || !meta.contains("config")) return "";
  const auto& old = meta.at("config");
  const std::int64_t old_world = meta.value("world_size", std::int64_t{1});
  if (old_world == world) return "";
  const std::int64_t old_batch = old.value("batch_size", c.batch_size);
  const std::int64_t global = checkpoint_images_per_step(meta);
  const std::int64_t per_round = c.batch_size * world;
  const bool kept_already = c.optimizer_batch_size > 0 ? c.optimizer_batch_size == global && global % per_round == 0
                                                       : per_round == global;
  const std::int64_t old_micro = std::max<std::int64_t>(1, global / (old_batch * old_world));
  // Said also where the flags keep it already (a world grown back to the one they were written for): the world
  // change itself is worth a line.
  const BatchSplit s = kept_already ? BatchSplit{c.batch_size, global / per_round, global, true}
                                    : split_global_batch(global, c.batch_size, world);
  std::ostringstream line;
  line << "resume: world " << old_world << " -> " << world << ": " << s.micro_batches << " micro-batch"
       << (s.micro_batches == 1 ? "" : "es") << " of " << s.batch << " per process instead of " << old_micro << " of "
       << old_batch;
  if (s.exact) {
    line << ", the checkpoint's " << global << " images a step kept (--resume-batch recipe)";
  } else {
    const double change = 100.0 * (static_cast<double>(s.global) / static_cast<double>(global) - 1);
    line << ": no equal split of the checkpoint's " << global << " images a step over " << world << " processes, so "
         << s.global << " (" << (change >= 0 ? "+" : "") << std::round(change * 10) / 10 << " %)";
    line << (c.lr_reference_batch > 0 ? "; the LR scales with it (--lr-reference-batch)"
                                      : "; the LR stays the checkpoint's (absolute --lr)");
  }
  if (!kept_already) {
    c.batch_size = s.batch;
    c.optimizer_batch_size = s.global;
  }
  return line.str();
}

}  // namespace convnets::train
