// Per-sample random numbers derived from (seed, epoch, index), so augmentation never depends on which thread ran it.
#pragma once

#include <cmath>
#include <cstdint>

namespace convnets::data {

// SplitMix64 (Steele, Lea & Flood, "Fast splittable pseudorandom number
// generators", 2014): a counter-based mixer, so every (seed, epoch, index)
// triple gets an independent stream without shared state between workers.
class Rng {
 public:
  explicit Rng(std::uint64_t seed) : state_(seed) {}
  Rng(std::uint64_t seed, std::int64_t epoch, std::int64_t index)
      : state_(mix(mix(mix(seed) ^ static_cast<std::uint64_t>(epoch)) ^ static_cast<std::uint64_t>(index))) {}

  std::uint64_t next() {
    state_ += 0x9e3779b97f4a7c15ULL;
    return mix(state_);
  }
  // Uniform in [0, 1) with 53 random bits.
  double uniform() { return static_cast<double>(next() >> 11) * 0x1.0p-53; }
  double uniform(double lo, double hi) { return lo + (hi - lo) * uniform(); }
  // Uniform integer in [lo, hi], unbiased (rejection on the 64-bit range).
  std::int64_t integer(std::int64_t lo, std::int64_t hi) {
    const std::uint64_t span = static_cast<std::uint64_t>(hi - lo) + 1;
    if (span == 0) return static_cast<std::int64_t>(next());
    const std::uint64_t limit = ~std::uint64_t(0) - (~std::uint64_t(0) % span);
    std::uint64_t r;
    do r = next();
    while (r >= limit);
    return lo + static_cast<std::int64_t>(r % span);
  }
  bool coin(double p = 0.5) { return uniform() < p; }
  // Standard normal (Box-Muller; one pair per call, the second value unused).
  double normal() {
    const double u1 = uniform(), u2 = uniform();
    return std::sqrt(-2.0 * std::log(1.0 - u1)) * std::cos(2.0 * 3.141592653589793 * u2);
  }

  static std::uint64_t mix(std::uint64_t z) {
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
    return z ^ (z >> 31);
  }

 private:
  std::uint64_t state_;
};

}  // namespace convnets::data
