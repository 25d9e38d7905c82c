// Progress output: one live line per phase on a terminal, a plain line every N steps otherwise.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace convnets::runtime {

class Progress {
 public:
  // `phase` e.g. "epoch 3/90 train"; `total` steps in the phase, `first` of
  // them already done before this process (a resumed epoch).
  Progress(std::string phase, std::int64_t total, std::int64_t print_every, bool terminal, std::int64_t first = 0);
  // Called after a step with the count of steps done in the phase.
  void update(std::int64_t done, double images_per_s, const std::string& extra);
  void finish(const std::string& summary);
  static bool stdout_is_terminal();

 private:
  std::string phase_;
  std::int64_t total_, every_;
  bool terminal_;
  std::int64_t first_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace convnets::runtime
