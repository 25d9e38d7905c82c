#include "core/memory.h"

#include <malloc.h>

#include <cstdlib>

namespace convnets {

void configure_host_allocator() {
#if defined(__GLIBC__)
  if (std::getenv("GLIBC_TUNABLES")) return;
  if (!std::getenv("MALLOC_MMAP_THRESHOLD_")) mallopt(M_MMAP_THRESHOLD, 32 * 1024 * 1024);
  if (!std::getenv("MALLOC_TRIM_THRESHOLD_")) mallopt(M_TRIM_THRESHOLD, 1 << 30);
#endif
}

void release_host_memory() { malloc_trim(0); }

}  // namespace convnets
