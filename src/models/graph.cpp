#include "models/graph.h"

#include "core/error.h"
#include "models/network.h"

#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/dropout.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/pooling.h>
#include <torch/torch.h>

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
    if (const auto* conv = m->as<models::Conv2dImpl>()) {
      const models::BatchNorm2dImpl* bn = i + 1 < children.size() ? children[i + 1].value()->as<models::BatchNorm2dImpl>() : nullptr;
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
    } else if (const auto* fc = m->as<models::LinearImpl>()) {
      y = g.linear(y, *fc, path);
    } else {
      throw Error("export: layer " + path + " (" + m->name() + ") cannot be expressed in the exported graph");
    }
  }
  return y;
}

namespace {

// Walks emit() only to collect the conv -> BN pairs; the values are dummies.
class PairCollector : public GraphEmitter {
 public:
  std::vector<std::pair<models::Conv2dImpl*, models::BatchNorm2dImpl*>> pairs;
  Value conv_bn(const Value& x, const models::Conv2dImpl& c, const std::string&, const models::BatchNorm2dImpl& bn,
                const std::string&) override {
    pairs.emplace_back(const_cast<models::Conv2dImpl*>(&c), const_cast<models::BatchNorm2dImpl*>(&bn));
    return x;
  }
  Value conv(const Value& x, const models::Conv2dImpl&, const std::string&) override { return x; }
  Value linear(const Value& x, const models::LinearImpl&, const std::string&) override { return x; }
  Value linear_1x1(const Value& x, const models::LinearImpl&, const std::string&) override { return x; }
  Value relu(const Value& x) override { return x; }
  Value silu(const Value& x) override { return x; }
  Value sigmoid(const Value& x) override { return x; }
  Value add(const Value& a, const Value&) override { return a; }
  Value mul(const Value& a, const Value&) override { return a; }
  Value max_pool(const Value& x, int, int, int) override { return x; }
  Value global_avg_pool(const Value& x) override { return x; }
  Value flatten(const Value& x) override { return x; }
};

}  // namespace

std::pair<torch::Tensor, torch::Tensor> fold_conv_bn(const models::Conv2dImpl& conv, const models::BatchNorm2dImpl& bn) {
  torch::NoGradGuard no_grad;
  // y = gamma (conv(x) + b - mean) / sqrt(var + eps) + beta
  const auto scale = bn.weight.to(torch::kDouble) / (bn.running_var.to(torch::kDouble) + bn.options.eps()).sqrt();
  auto b = conv.bias.defined() ? conv.bias.to(torch::kDouble) : torch::zeros_like(scale);
  b = (b - bn.running_mean.to(torch::kDouble)) * scale + bn.bias.to(torch::kDouble);
  const auto w = conv.weight.to(torch::kDouble) * scale.view({-1, 1, 1, 1});
  return {w.to(conv.weight.scalar_type()), b.to(conv.weight.scalar_type())};
}

int fold_batchnorm(NetworkImpl& model) {
  PairCollector collector;
  model.emit(collector, "input");
  torch::NoGradGuard no_grad;
  for (auto& [conv, bn] : collector.pairs) {
    if (bn->folded()) continue;  // already folded (a second call)
    auto [w, b] = fold_conv_bn(*conv, *bn);
    conv->weight.copy_(w);
    if (conv->bias.defined()) {
      conv->bias.copy_(b);
    } else {
      conv->set_bias(b);
    }
    bn->set_folded();
  }
  return static_cast<int>(collector.pairs.size());
}

}  // namespace convnets
