#include "train/run_outputs.h"

#include "codec/png.h"
#include "core/error.h"
#include "core/json.h"
#include "io/atomic_file.h"
#include "io/state_dict.h"
#include "train/asp.h"
#include "train/workspace.h"

#include <torch/torch.h>

#include <charconv>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <sstream>

namespace convnets::train {

using runtime::kCheckpointFormat;
using runtime::save_checkpoint;
namespace fs = std::filesystem;

namespace {

nlohmann::ordered_json derived_values(const TrainingRun& run) {
  const auto& c = run.config;
  return {{"optimizer_batch", run.optimizer_batch},
          {"micro_batches_per_step", run.micro_per_step},
          {"world_size", run.world},
          {"sync_bn", c.sync_bn && run.world > 1},
          {"base_lr_scaled", run.base_lr},
          {"steps_per_epoch", run.steps_per_epoch},
          {"warmup_steps", run.schedule->warmup_steps()},
          {"num_classes", run.num_classes},
          {"preprocessing", to_json(run.pre)},
          {"device", run.rt.device.str()},
          {"train_data", run.train_data->description()},
          {"val_data", run.val_data ? run.val_data->description() : ""}};
}

nlohmann::json checkpoint_meta(const TrainingRun& run) {
  nlohmann::json m;
  m["format"] = kCheckpointFormat;
  m.update(architecture_meta(run.arch));
  m["num_classes"] = run.num_classes;
  m["class_names"] = run.train_data->classes();
  m["preprocessing"] = to_json(run.pre);
  m["config"] = run.resolved_config;
  m["epoch"] = run.position.epoch;
  m["step_in_epoch"] = run.position.step_in_epoch;
  m["step"] = run.position.global_step;
  m["best_top1"] = run.position.best_top1;
  m["best_epoch"] = run.position.best_epoch;
  m["seed"] = run.config.seed;
  // Augmentation, data order and mixup draw from counter-based streams of
  // (seed, epoch, index) and (seed, step): the position is the RNG state.
  m["rng"] = "splitmix64(seed, epoch, sample) for data; splitmix64(seed, step, micro-batch) for mixup";
  m["loss_scale"] = run.scaler ? run.scaler->value() : 1.0;
  m["world_size"] = run.world;
  m["images_per_step"] = run.optimizer_batch;
  if (!run.options.torchrun_job.empty()) m["torchrun_job"] = run.options.torchrun_job;
  if (run.quant) m["quantization"] = quant::to_json(*run.quant);
  return m;
}

// What a checkpoint holds besides its metadata: the weights, the EMA's, the optimizer's and loss scaler's state
// and the CPU generator's.
NamedTensors run_state(const TrainingRun& run) {
  NamedTensors tensors;
  for (auto& [k, t] : state_dict(*run.model)) tensors.emplace_back("model." + k, t);
  if (run.ema) {
    for (auto& [k, t] : state_dict(*run.ema->model())) tensors.emplace_back("ema." + k, t);
  }
  for (auto& e : run.optimizer->state()) tensors.push_back(e);
  if (run.scaler) {
    for (auto& e : run.scaler->state()) tensors.push_back(e);
  }
  tensors.emplace_back("rng.torch_cpu", at::detail::getDefaultCPUGenerator().get_state());
  return tensors;
}

}  // namespace

void open_workspace(TrainingRun& run, LogLock log_lock) {
  const auto& c = run.config;
  run.last_path = last_checkpoint_path(c.workspace);
  run.resolved_config = to_json(c);
  if (!run.writer) return;
  const auto log_path = (fs::path(c.workspace) / c.raport_file).string();
  if (!run.resume && fs::exists(run.last_path)) {
    throw Error("--workspace " + c.workspace + " already holds a run (" + run.last_path + ")",
                "continue it with --resume " + run.last_path + ", or pick another --workspace");
  }
  if (!run.resume && fs::exists(log_path)) {
    // A run without checkpoints (or stopped before its first) leaves only its log.
    const bool live = being_written(log_path) == true;
    if (!live && run.options.take_over_left_log) {
      std::string aside;
      for (int n = 1; aside.empty() || fs::exists(aside); ++n) aside = log_path + ".stopped-" + std::to_string(n);
      fs::rename(log_path, aside);
      std::cerr << "convnets: warning: --workspace " << c.workspace << " held only the log of a run that stopped "
                << "before its first checkpoint; kept as " << aside << ", a new run starts\n";
    } else {
      throw Error("--workspace " + c.workspace + " already holds a run's log (" + log_path + "), " +
                    (live ? "written by a run that is still going" : "with no checkpoint to resume from"),
                  live ? "pick another --workspace or --raport-file"
                       : "pick another --workspace or --raport-file, or --resume auto to set the stopped run's log "
                         "aside and start anew");
    }
  }
  fs::create_directories(c.workspace);
  // First, so that a run still going in this workspace is found (the log's
  // lock) before anything of it is touched.
  run.log = std::make_unique<DlLogger>(log_path, /*append=*/run.resume != nullptr, std::move(log_lock));
  // A run killed while saving leaves its temporary file, as large as a
  // checkpoint; resuming in a workspace that keeps them would fill the disk.
  for (const auto& stale : remove_stale_temporaries(c.workspace)) {
    std::cout << "workspace: removed " << stale << ", left by an interrupted write\n";
  }
  const auto derived = derived_values(run);
  write_file_atomically((fs::path(c.workspace) / "config.json").string(),
                        dump_json(nlohmann::ordered_json{{"config", run.resolved_config}, {"derived", derived}}, 2) + "\n");
  nlohmann::ordered_json params = run.resolved_config;
  params.update(derived);
  params["resumed_from"] = run.resume ? run.resume->path : "";
  // report --watch reads an unlocked log as a stopped run only from a writer
  // that says it locks (not DLE's Python DLLogger, nor a file system without flock).
  params["log_lock"] = run.log->locked();
  run.log->log("PARAMETER", params);
  for (const char* m : {"train.loss", "val.loss"}) run.log->metadata(m, {{"unit", ""}, {"format", ":>.5f"}});
  for (const char* m : {"train.total_ips", "train.compute_ips", "val.total_ips", "val.compute_ips"}) {
    run.log->metadata(m, {{"unit", "images/s"}, {"format", ":>.2f"}});
  }
  for (const char* m : {"val.top1", "val.top5"}) run.log->metadata(m, {{"unit", "%"}, {"format", ":>.2f"}});
  if (c.tensorboard) {
    run.tensorboard = std::make_unique<report::EventWriter>(
        c.tensorboard_dir.empty() ? (fs::path(c.workspace) / "tensorboard").string() : c.tensorboard_dir);
    // A resumed run repeats the steps after its checkpoint: TensorBoard drops
    // what the interrupted run logged from here on.
    if (run.resume) run.tensorboard->session_start(run.position.global_step + 1);
    run.tensorboard->text("config", run.position.global_step,
                          "```\n" + dump_json(nlohmann::ordered_json{{"config", run.resolved_config}, {"derived", derived}}, 2) +
                              "\n```");
    run.tensorboard->flush();
  }
  // Ten minutes where a lost machine costs every process's work; a single process's run is cheaper to repeat.
  const double minutes = c.checkpoint_interval < 0 ? (run.world > 1 ? 10.0 : 0.0) : c.checkpoint_interval;
  if (c.checkpoints && (minutes > 0 || c.checkpoint_every_steps > 0)) {
    run.saver = std::make_unique<runtime::BackgroundSaver>();
    run.checkpoint_interval_s = minutes * 60;
    run.last_saved = std::chrono::steady_clock::now();
  }
}

void update_summary_csv(const TrainingRun& run, std::int64_t epoch, const nlohmann::ordered_json& data) {
  if (!run.log || !run.writer) return;
  const auto path = fs::path(run.config.workspace) / "summary.csv";
  std::string text = "epoch,train_loss,eval_loss,eval_top1,eval_top5,lr\n";
  if (std::ifstream in(path); in) {
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::int64_t logged = 0;
      const auto comma = line.find(',');
      if (comma == std::string::npos) continue;
      const auto end = line.data() + comma;
      const auto [ptr, ec] = std::from_chars(line.data(), end, logged);
      if (ec == std::errc() && ptr == end && logged < epoch) text += line + '\n';
    }
  }
  const auto value = [&](const char* key) {
    return data.contains(key) && data[key].is_number() ? data[key].dump() : std::string();
  };
  text += std::to_string(epoch) + ',' + value("train.loss") + ',' + value("val.loss") + ',' + value("val.top1") +
          ',' + value("val.top5") + ',' + value("train.lr") + '\n';
  write_file_atomically(path.string(), text);
}

void log_metrics(TrainingRun& run, const nlohmann::json& step, const nlohmann::ordered_json& data) {
  if (run.log) run.log->log(step, data);
  if (!run.tensorboard) return;
  const bool per_step = step.size() == 2;
  for (auto it = data.begin(); it != data.end(); ++it) {
    if (!it.value().is_number()) continue;
    const std::string& k = it.key();
    const bool validation = k.rfind("val", 0) == 0;
    run.tensorboard->scalar(per_step || validation ? k : "epoch/" + k, run.position.global_step, it.value().get<double>());
  }
  run.tensorboard->flush();
}

void log_images(TrainingRun& run, const at::Tensor& images) {
  if (!run.tensorboard || !images.defined()) return;
  const auto cpu = images.to(torch::kCPU).contiguous();  // uint8 [B, H, W, C]
  const int h = static_cast<int>(cpu.size(1)), w = static_cast<int>(cpu.size(2)), ch = static_cast<int>(cpu.size(3));
  const auto n = std::min<std::int64_t>(cpu.size(0), 8);
  for (std::int64_t i = 0; i < n; ++i) {
    const auto png = codec::encode_png(cpu[i].data_ptr<std::uint8_t>(), w, h, ch);
    run.tensorboard->image("train/first_batch/" + std::to_string(i), run.position.global_step, png, h, w, ch);
  }
  run.tensorboard->flush();
}

void print_run_summary(const TrainingRun& run) {
  if (!run.writer) return;
  const auto& c = run.config;
  std::cout << "train: " << run.arch.name << ", " << run.train_data->description() << '\n'
            << "       " << run.steps_per_epoch << " steps/epoch of " << run.optimizer_batch << " images"
            << (run.world > 1 ? " (" + std::to_string(run.world) + " processes x " + std::to_string(c.batch_size) + ")"
                              : "")
            << (run.micro_per_step > 1 ? " (" + std::to_string(run.micro_per_step) + " micro-batches)" : "")
            << ", lr " << run.base_lr << " " << c.lr_schedule << ", "
            << run.rt.device.str() << " " << c.precision << ", " << run.train_loader->workers() << " loader threads\n";
  // On CUDA, where it decides the step's speed; a CPU run never fuses.
  if (run.rt.device.is_cuda() && !run.fused_bn.empty()) std::cout << "       fused BN: " << run.fused_bn << '\n';
  if (run.rt.device.is_cuda() && !run.tuning.empty()) std::cout << "       step tuner: " << run.tuning << '\n';
  if (run.teacher && c.teacher_two_res) {
    std::cout << "       distillation: teacher " << c.teacher << " from " << c.teacher_checkpoint << " at "
              << run.load_size << " px, student at " << run.pre.input_size << " px (two resolutions)\n";
  } else if (run.teacher) {
    std::cout << "       distillation: teacher " << c.teacher << " from " << c.teacher_checkpoint
              << " on the student's batch at " << run.pre.input_size << " px\n";
  }
  if (run.group) {
    std::cout << "       data-parallel: " << run.world << " ranks over " << run.group->backend() << " ("
              << run.worker->source << ", store " << run.worker->master_addr << ":" << run.worker->master_port
              << "), " << run.reducer->stats().buckets << " gradient buckets of <= " << c.bucket_mb << " MiB"
              << (c.sync_bn ? ", synchronized BN" : "") << '\n';
  }
  if (run.saver) {
    std::ostringstream when;
    if (run.checkpoint_interval_s > 0) when << "every " << run.checkpoint_interval_s / 60 << " min";
    if (run.checkpoint_interval_s > 0 && c.checkpoint_every_steps > 0) when << " and ";
    if (c.checkpoint_every_steps > 0) when << "every " << c.checkpoint_every_steps << " steps";
    std::cout << "       checkpoints: " << run.last_path << " " << when.str()
              << " mid-epoch, written in the background\n";
  }
  if (run.val_loader) {
    std::cout << "       best checkpoint by " << (best_by_ema(run) ? "EMA" : "model") << " top-1"
              << (run.ema ? ", EMA decay " + std::to_string(c.ema) + (c.ema_warmup ? " with DLE's warm-up" : "") : "")
              << '\n';
  }
  if (run.resume) {
    std::cout << "resume: " << run.resume->path << " at epoch " << run.position.epoch + 1 << ", step "
              << run.position.step_in_epoch << "/" << run.steps_per_epoch << '\n';
  }
}

void save_run(const TrainingRun& run, const std::string& path) {
  if (!run.writer || !run.config.checkpoints) return;
  if (run.saver) run.saver->wait();
  save_checkpoint(path, run_state(run), checkpoint_meta(run));
}

bool checkpoint_due(const TrainingRun& run) {
  if (!run.saver) return false;
  const auto every = run.config.checkpoint_every_steps;
  if (every > 0 && run.position.global_step % every == 0) return true;
  return run.checkpoint_interval_s > 0 &&
         std::chrono::duration<double>(std::chrono::steady_clock::now() - run.last_saved).count() >=
             run.checkpoint_interval_s;
}

void save_run_in_background(TrainingRun& run) {
  const auto timing = run.saver->save(run.last_path, run_state(run), checkpoint_meta(run));
  run.last_saved = std::chrono::steady_clock::now();
  if (timing.waited()) {
    char waited[32];
    std::snprintf(waited, sizeof waited, "%.2f", timing.waited_s);
    std::cout << "checkpoint: the previous background write of " << run.last_path << " was still running at step "
              << run.position.global_step << "; the step waited " << waited
              << " s for it (a longer --checkpoint-interval or --checkpoint-every-steps avoids that)\n";
  }
}

}  // namespace convnets::train
