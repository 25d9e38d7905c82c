#include "models/graph.h"

#include "core/error.h"
#include "models/network.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>

namespace convnets {

std::string NetworkImpl::emit(GraphEmitter&, const std::string&) {
  throw Error("this network has no graph form to export (" + name() + ")");
}

GraphEmitter::Value emit_sequential(GraphEmitter& g, const torch::nn::SequentialImpl& seq, const GraphEmitter::Value& x,
                                    const std::string& name) {
  namespace nn = torch::nn;
  auto y = x;
  const auto children = seq.named_children();
  for (std::size_t i = 0; i < children.size(); ++i) {
    const auto& m = children[i].value();
    const std::string path = name + "." + children[i].key();
    if (const auto* conv = m->as<layers::Conv2dImpl>()) {
      const layers::BatchNorm2dImpl* bn = i + 1 < children.size() ? children[i + 1].value()->as<layers::BatchNorm2dImpl>() : nullptr;
      if (bn) {
        y = g.conv_bn(y, *conv, path, *bn, name + "." + children[i + 1].key());
        ++i;
      } else {
        y = g.conv(y, *conv, path);
      }
    } else if (m->as<nn::ReLUImpl>()) {
      y = g.relu(y);
    } else if (m->as<nn::SiLUImpl>()) {
      y = g.silu(y);
    } else if (m->as<nn::SigmoidImpl>()) {
      y = g.sigmoid(y);
    } else if (const auto* pool = m->as<nn::AdaptiveAvgPool2dImpl>()) {
      const auto& size = *pool->options.output_size();
      if (size[0] != 1 || size[1] != 1) {
        throw Error("export: layer " + path + " is an adaptive average pool to a size other than 1x1");
      }
      y = g.global_avg_pool(y);
    } else if (m->as<nn::FlattenImpl>()) {
      y = g.flatten(y);
    } else if (m->as<nn::DropoutImpl>()) {
      // the identity in eval mode
    } else if (const auto* fc = m->as<layers::LinearImpl>()) {
      y = g.linear(y, *fc, path);
    } else {
      throw Error("export: layer " + path + " (" + m->name() + ") cannot be expressed in the exported graph");
    }
  }
  return y;
}

}  // namespace convnets
