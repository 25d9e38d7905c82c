// Host memory allocator settings for training-sized tensors.
#pragma once

namespace convnets {

// LibTorch's CPU tensors come straight from glibc malloc. With its defaults,
// every multi-megabyte activation is an mmap (or a heap top that is trimmed
// on free), so each training step page-faults its whole working set again:
// measured on ResNet-8 at batch 128, 2 threads, forward+backward took ~120 ms
// instead of ~95 ms (docs/PERFORMANCE.md). This keeps buffers up to 32 MiB
// (glibc's mmap-threshold ceiling) on the heap and stops trimming it, so
// freed activations are reused. A user's own MALLOC_*_ or GLIBC_TUNABLES
// settings win. Call once at start-up, before large allocations.
void configure_host_allocator();

// Gives the heap's free memory back to the system (malloc_trim): after an
// allocation failure, so that what a retried smaller batch finds is what a
// fresh process would.
void release_host_memory();

}  // namespace convnets
