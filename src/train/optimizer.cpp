#include "train/optimizer.h"

#include "core/error.h"
#include "train/rmsprop.h"
#include "train/sgd.h"

namespace convnets::train {

std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& o) {
  if (o.kind == "rmsproptf") return std::make_unique<RmsPropTf>(model, o);
  if (o.kind != "sgd") throw Error("--optimizer must be sgd or rmsproptf, got '" + o.kind + "'");
  return std::make_unique<Sgd>(model, SgdOptions{o.momentum, o.nesterov, o.weight_decay, o.decay_all});
}

}  // namespace convnets::train
