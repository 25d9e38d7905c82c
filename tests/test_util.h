// Helpers shared by the C++ tests: reference-file locations and tensor comparison.
#pragma once

#include <gtest/gtest.h>
#include <torch/types.h>

#include <cstdlib>
#include <filesystem>
#include <string>

namespace convnets::test {

// shared/ (reference material) or "" when absent: a user's fresh clone has none.
inline std::string shared_dir() {
  const char* env = std::getenv("CONVNETS_SHARED_DIR");
  if (env && std::filesystem::is_directory(env)) return env;
  return "";
}

// ||a - b||_inf / ||b||_inf: the error relative to the reference's scale, so
// that logits near zero do not turn rounding noise into huge ratios.
inline double max_relative_error(const torch::Tensor& a, const torch::Tensor& b) {
  auto ad = a.to(torch::kFloat64), bd = b.to(torch::kFloat64);
  const double scale = bd.abs().max().item<double>();
  const double diff = (ad - bd).abs().max().item<double>();
  return scale > 0 ? diff / scale : diff;
}

}  // namespace convnets::test

// GTEST_SKIP that names why, so a skip is never mistaken for a pass.
#define CONVNETS_REQUIRE_SHARED(dir)                                                              \
  const std::string dir = ::convnets::test::shared_dir();                                         \
  if (dir.empty()) GTEST_SKIP() << "shared/ reference material not found (CONVNETS_SHARED_DIR); " \
                                   "it sits beside the clone in CI";
