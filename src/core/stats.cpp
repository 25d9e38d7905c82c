#include "core/stats.h"

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstddef>

namespace convnets {

double percentile(std::vector<double> values, double q) {
  if (values.empty()) return 0;
  const auto n = static_cast<double>(values.size());
  const auto k = static_cast<std::size_t>(std::clamp(std::ceil(q / 100.0 * n) - 1.0, 0.0, n - 1));
  std::nth_element(values.begin(), values.begin() + static_cast<std::ptrdiff_t>(k), values.end());
  return values[k];
}

double median(std::vector<double> values) {
  if (values.empty()) return 0;
  std::sort(values.begin(), values.end());
  return (values[(values.size() - 1) / 2] + values[values.size() / 2]) / 2;
}

double process_cpu_seconds() {
  rusage u{};
  ::getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec) * 1e-6;
}

}  // namespace convnets
