// Intra-op thread count for LibTorch's CPU kernels.
#pragma once

namespace convnets {

// LibTorch picks its default from the physical-core count, which some VMs report
// as 1 (seen on the 2-vCPU CI machine: 1 thread, ~10x slower ResNet-50 forward).
// requested <= 0 means: OMP_NUM_THREADS if set, else every online CPU.
// Returns the count in effect.
int configure_threads(int requested);

}  // namespace convnets
