// A training run's fusions on its runtime: which BN layers and residual-block paths run fused under --fusion, the start line's account of them, and the step tuner's timing of each block shape on the run's device.
#pragma once

#include "models/fusion.h"
#include "models/network.h"
#include "runtime/runtime.h"
#include "runtime/tuner.h"

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::runtime {

// Training's fusions for `rt` under --fusion `mode` (models/fusion.h), before any timing: BN+ReLU and BN+add+ReLU
// on (models::BatchNorm2dImpl::forward_fused, cuDNN probed once on CUDA first) unless the mode is none, and each
// residual block on its default path. Returns the start line's account of which layers and blocks fuse and why the
// rest do not.
std::string set_fusion(NetworkImpl& model, const Runtime& rt, models::FusionMode mode);
// The same account, later: after a CUDA step it also names the graphs cuDNN had no engine for.
std::string describe_fusion(NetworkImpl& model, const Runtime& rt, models::FusionMode mode);

// The step tuner (runtime/tuner.h) on a micro-batch of `sizes` (NCHW order): on CUDA each block shape's admitted,
// verified paths timed and the fastest set, the choices read from and written to the tuning cache `cache_flag`
// names ("": default_tuning_cache(); "none": no cache). Off CUDA, where nothing fuses, it times nothing.
TuneReport tune_fusion(NetworkImpl& model, const Runtime& rt, models::FusionMode mode,
                       const std::vector<std::int64_t>& sizes, const std::string& cache_flag);

}  // namespace convnets::runtime
