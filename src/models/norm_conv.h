// A residual block trained with each BN's batch statistics taken in the convolution before it and its scale, bias and ReLU applied as the next convolution reads (MLPerf's NormConv, Paddle's fused_resunit): the block as one autograd function with its backward written out, over two sets of primitive ops (ATen's, cuDNN's graphs + kernels/bn_stats).
#pragma once

#include "models/cudnn_graphs.h"
#include "models/fusion.h"
#include "models/layers.h"

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::models::norm_conv {

// One convolution of the block and the BN after it, as the block's modules hold them.
struct ConvBn {
  Conv2dImpl* conv = nullptr;
  BatchNorm2dImpl* bn = nullptr;
};

// A ResNet block's residual branch (conv1..convL, each followed by its BN; a ReLU after every BN but the last) and
// its shortcut (the downsample conv and BN, or none: the identity); out = relu(bn_L(conv_L(...)) + shortcut(x)).
struct Block {
  std::vector<ConvBn> branch;
  ConvBn downsample;  // conv null: the identity
};

// Whose primitives run the block: ATen's ops (any device and dtype; what the CPU tests compare the backward's
// arithmetic with) or cuDNN's graphs and the project's kernels (CUDA, fp16/bf16, NHWC).
enum class Backend { Aten, Cudnn };

// The block's forward in training mode, its backward through autograd; the BNs' running statistics and
// num_batches_tracked updated as BatchNorm2d's own forward would. Gradients reach x, every conv weight and every BN
// weight and bias. Under Backend::Cudnn the activations must be fp16 or bf16 NHWC CUDA tensors.
at::Tensor forward(const Block& block, const at::Tensor& x, Backend backend);

// Why a block of these modules cannot run this way in `context`, or "": the part-2 rules (CUDA, fp16/bf16, NHWC,
// not synchronized, --fusion admitting it), and the block's shape: every conv ungrouped and undilated with a square
// kernel, every width a multiple of 8 (cuDNN's 16-byte vectors of fp16), its last BN followed by the add.
std::string refusal(const FusedBnContext& context, const Block& block);

// The tensors forward() is given are what refusal() assumed (a CUDA fp16/bf16 channels-last batch).
bool takes(const at::Tensor& x, const Block& block);

// Builds every cuDNN plan the block will run on input x (cudnn_graphs.h's prepare for each convolution):
// "" when all built, else why not (the block then keeps the fused BN path). Call outside a CUDA graph capture.
std::string prepare(const Block& block, const at::Tensor& x);

// The geometry of each convolution of the block on input x: the branch's, then the downsample's.
std::vector<ConvGeometry> geometries(const Block& block, const at::Tensor& x);

}  // namespace convnets::models::norm_conv
