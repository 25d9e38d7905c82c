// Test probe: runs convnets training steps on weights and batches given in a safetensors file, for the PyTorch reference test.
//
// train_probe IN.safetensors OUT.safetensors
// IN: "model.<key>" weights, "input.<step>.<micro>.images" (float NCHW) and
// ".labels" (int64), metadata "probe" = JSON {arch, num_classes, steps,
// micro_batches, first_step, momentum, nesterov, weight_decay,
// bn_weight_decay, label_smoothing, mixup, seed, memory_format, schedule:
// {kind, base_lr, warmup_epochs, steps_per_epoch, epochs, end_lr, per_epoch}}.
// OUT: "param.<name>", "momentum.<name>", "buffer.<name>", metadata "result" =
// {lrs: [...], losses: [...], mixup: [[{lam, perm}...]...]}.
#include "io/safetensors.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "runtime/runtime.h"
#include "train/schedule.h"
#include "train/sgd.h"
#include "train/step.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <iostream>

using namespace convnets;

int main(int argc, char** argv) {
  if (argc != 3) {
    std::cerr << "usage: train_probe IN.safetensors OUT.safetensors\n";
    return 2;
  }
  try {
    torch::set_num_threads(1);  // the reference runs single-threaded too: same reduction order
    const auto in = load_safetensors(argv[1]);
    const auto p = nlohmann::json::parse(in.metadata.at("probe"));
    const auto& arch = find_architecture(p.at("arch").get<std::string>());
    ModelOptions mo;
    mo.num_classes = p.at("num_classes").get<std::int64_t>();
    auto model = build_model(arch, mo);
    TensorFile weights;
    for (const auto& [k, t] : in.tensors) {
      if (k.rfind("model.", 0) == 0) weights.tensors.emplace_back(k.substr(6), t);
    }
    load_state_dict(*model, weights, argv[1]);
    const auto rt = runtime::resolve_runtime("cpu", "fp32", p.at("memory_format").get<std::string>());
    runtime::prepare_model(*model, rt);
    train::Sgd sgd(*model, {p.at("momentum").get<double>(), p.at("nesterov").get<bool>(),
                            p.at("weight_decay").get<double>(), p.at("bn_weight_decay").get<bool>()});
    const auto& s = p.at("schedule");
    train::ScheduleOptions so;
    so.kind = s.at("kind").get<std::string>();
    so.base_lr = s.at("base_lr").get<double>();
    so.warmup_epochs = s.at("warmup_epochs").get<double>();
    so.steps_per_epoch = s.at("steps_per_epoch").get<std::int64_t>();
    so.epochs = s.at("epochs").get<std::int64_t>();
    so.end_lr = s.value("end_lr", 0.0);
    so.per_epoch = s.at("per_epoch").get<bool>();
    const train::LrSchedule schedule(so);
    train::StepOptions opts;
    opts.label_smoothing = p.at("label_smoothing").get<double>();
    opts.mix.mixup = p.at("mixup").get<double>();
    opts.seed = p.at("seed").get<std::uint64_t>();
    nlohmann::json result{{"lrs", nlohmann::json::array()}, {"losses", nlohmann::json::array()},
                          {"mixup", nlohmann::json::array()}};
    const auto first = p.at("first_step").get<std::int64_t>();
    for (std::int64_t step = 0; step < p.at("steps").get<std::int64_t>(); ++step) {
      std::vector<train::MicroBatch> micro;
      for (std::int64_t m = 0; m < p.at("micro_batches").get<std::int64_t>(); ++m) {
        const std::string base = "input." + std::to_string(step) + "." + std::to_string(m);
        auto images = in.find(base + ".images")->clone();
        if (rt.channels_last) images = images.contiguous(at::MemoryFormat::ChannelsLast);
        micro.push_back({images, in.find(base + ".labels")->clone()});
      }
      const double lr = schedule.at(first + step);
      auto out = train::train_step(*model, sgd, nullptr, nullptr, micro, lr, first + step, opts);
      result["lrs"].push_back(lr);
      result["losses"].push_back(out.loss.item<double>());
      nlohmann::json draws = nlohmann::json::array();
      for (const auto& d : out.mixup) draws.push_back({{"lam", d.lam}, {"perm", d.perm}});
      result["mixup"].push_back(draws);
    }
    NamedTensors out;
    for (const auto& q : sgd.params()) {
      out.emplace_back("param." + q.name, q.value.contiguous());
      out.emplace_back("momentum." + q.name, q.momentum.contiguous());
    }
    for (const auto& b : model->named_buffers()) out.emplace_back("buffer." + b.key(), b.value().contiguous());
    save_safetensors(argv[2], out, {{"result", result.dump()}});
  } catch (const std::exception& e) {
    std::cerr << "train_probe: " << e.what() << '\n';
    return 1;
  }
  return 0;
}
