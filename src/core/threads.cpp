#include "core/threads.h"

#include <ATen/Parallel.h>

#include <cstdlib>
#include <string>
#include <thread>

namespace convnets {

int configure_threads(int requested) {
  int n = requested;
  if (n <= 0) {
    if (const char* env = std::getenv("OMP_NUM_THREADS")) n = std::atoi(env);
  }
  if (n <= 0) n = static_cast<int>(std::thread::hardware_concurrency());
  if (n <= 0) n = 1;
  at::set_num_threads(n);
  return at::get_num_threads();
}

}  // namespace convnets
