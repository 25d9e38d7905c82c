#include "train/optimizer.h"

#include "core/error.h"
#include "train/rmsprop.h"
#include "train/sgd.h"

namespace convnets::train {

std::unique_ptr<Optimizer> make_optimizer(torch::nn::Module& model, const OptimizerOptions& o) {
  if (o.kind == "rmsproptf" || o.kind == "rmsprop") return std::make_unique<RmsProp>(model, o);
  if (o.kind != "sgd") throw Error("--optimizer must be sgd, rmsproptf or rmsprop, got '" + o.kind + "'");
  return std::make_unique<Sgd>(model, SgdOptions{o.momentum, o.nesterov, o.weight_decay, o.decay_all});
}

}  // namespace convnets::train
