// The vocabulary of `--fusion`: the paths a residual block may train on, the modes that admit them, and their spellings; torch-free so the configuration parser (and its fuzz target) can check the flag.
#pragma once

#include <string>
#include <vector>

namespace convnets::models {

// One way a residual block trains, each the same function (He et al. 2016's block) on different kernels:
//   Unfused   conv, BN, ReLU and the residual add as separate ATen ops (cuDNN's plain convolutions and BN)
//   Bn        each BN+ReLU and the last BN+add+ReLU as one cuDNN call (Paddle's fuse_bn_add_act_ops)
//   BnFold    Bn, and the two gradients meeting at the block's input summed by the first convolution's dgrad as it
//             writes them (an add in cuDNN's dgrad epilogue) instead of by a separate add (models/grad_fold.h)
//   NormConv  the whole block as one function with its BN statistics in the convolutions (MLPerf's NormConv,
//             models/norm_conv.h)
enum class FusionPath { Unfused, Bn, BnFold, NormConv };
// Every path, in the order the tuner prefers them when their times tie (the simpler first).
const std::vector<FusionPath>& all_fusion_paths();
const char* path_name(FusionPath path);  // "none", "bn", "bn+fold", "normconv"

// `--fusion`: auto (each block's verified paths timed on the GPU, the fastest kept), or one family for every block,
// for comparison: none (Unfused), bn (Bn or BnFold, the faster), normconv.
enum class FusionMode { Auto, None, Bn, NormConv };
const char* mode_name(FusionMode mode);
// `text` as --fusion's value; an Error naming `flag` and the choices otherwise.
FusionMode parse_fusion_mode(const std::string& text, const std::string& flag = "--fusion");
// The paths `mode` lets a block run, in preference order.
std::vector<FusionPath> admitted_paths(FusionMode mode);

}  // namespace convnets::models
