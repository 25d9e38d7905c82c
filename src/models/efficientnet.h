// EfficientNet (Tan & Le 2019) as timm 0.5.4 builds its TensorFlow ports: the scaled B0 block list, the network, its preprocessing.
#pragma once

#include "models/network.h"

#include <cstdint>
#include <string>
#include <vector>

namespace convnets {

// Reproduces timm 0.5.4's `tf_efficientnet_*` models (timm/models/efficientnet.py
// _gen_efficientnet; efficientnet_builder.py and efficientnet_blocks.py, which
// later timm renamed _efficientnet_*.py; layers/padding.py, conv2d_same.py),
// the teachers of NVIDIA DLE's GPUNet distillation recipes (train_params/
// GPUNet-P0/P1: tf_efficientnet_b2, D1: tf_efficientnet_b5_ns, D2: _b6_ns):
// the same layers, widths, depths, TF "SAME" padding, BN eps and state_dict
// keys, so timm's published weights load after tools/pth2safetensors.py.
struct EfficientNetVariant {
  std::string name;  // timm's model name, e.g. tf_efficientnet_b5_ns
  std::string description;
  double channel_multiplier = 1.0;  // width scaling of every stage, the stem and the head
  double depth_multiplier = 1.0;    // block repeats per stage, rounded up
  Preprocessing preprocessing;      // timm's default_cfg: input_size, crop_pct, bicubic, ImageNet mean/std
};
const std::vector<EfficientNetVariant>& efficientnet_variants();

// One stage of timm's arch_def after decoding (_decode_block_str), e.g.
// "ir_r2_k3_s2_e6_c24_se0.25": an inverted residual ("ir") or a depthwise-
// separable block ("ds"), repeated r times, kernel k, stride s (the stage's
// first block), expansion e, c output channels, squeeze-excite ratio se of
// the block's input channels.
struct EfficientNetStage {
  std::string type;  // "ds" | "ir"
  std::int64_t repeats = 1, kernel = 3, stride = 1, channels = 0;
  double expansion = 1.0, se_ratio = 0.0;
};
// Decodes one block string of the subset EfficientNet-B0 uses (types ds and
// ir, options r, k, s, e, c, se); anything else throws convnets::Error
// naming the string and the part it does not know.
EfficientNetStage decode_efficientnet_stage(const std::string& block);
// The B0 definition with the repeats scaled by `depth_multiplier` (ceil, as
// timm's depth_trunc='ceil') and the widths by `channel_multiplier` (timm's
// round_channels: make_divisible with divisor 8).
std::vector<EfficientNetStage> efficientnet_stages(double channel_multiplier, double depth_multiplier);

// The network, named as timm's (conv_stem, bn1, blocks.i.j.*, conv_head, bn2,
// classifier), initialised as timm's _init_weight_goog. Defaults as timm's
// create_model: no dropout before the classifier, no drop-path; options.dropout
// and options.drop_path set them as timm's --drop and --drop-path do (the
// paper's B2/B5/B6 rates are 0.3/0.4/0.5 and 0.2). options.conv_init is not
// used: the init is timm's. options.zero_init_residual zeroes the last BN
// gamma of each residual block.
Network make_efficientnet(const EfficientNetVariant& variant, const ModelOptions& options);

}  // namespace convnets
