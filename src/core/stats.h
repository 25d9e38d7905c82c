// The few statistics every measurement reports: nearest-rank percentiles, medians, and the process's CPU seconds.
#pragma once

#include <vector>

namespace convnets {

// The nearest-rank percentile (q in [0, 100]) of unsorted values: the smallest value at least q % of them do not
// exceed, as perf_analyzer's and Triton's reports take it; 0 for none.
double percentile(std::vector<double> values, double q);

// The median: the middle value, or the mean of the two middle ones; 0 for none.
double median(std::vector<double> values);

// This process's CPU time so far, user and system, in seconds (Prometheus' process_cpu_seconds_total).
double process_cpu_seconds();

}  // namespace convnets
