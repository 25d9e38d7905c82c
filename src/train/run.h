// A training run's state that outlives a step (data, model, optimizer, position, outputs) and how it is built from a config.
#pragma once

#include "data/loader.h"
#include "distributed/grad_sync.h"
#include "distributed/group.h"
#include "models/network.h"
#include "models/registry.h"
#include "quant/qdq.h"
#include "report/tensorboard.h"
#include "runtime/background_save.h"
#include "runtime/checkpoint.h"
#include "runtime/runtime.h"
#include "train/config.h"
#include "train/dllogger.h"
#include "train/ema.h"
#include "train/loss_scale.h"
#include "train/optimizer.h"
#include "train/schedule.h"
#include "train/trainer.h"

#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace convnets::train {

class AspOptimizer;

// Where a run stands: the next step to run. Every checkpoint records it and
// --resume restores it.
struct RunPosition {
  std::int64_t epoch = 0;          // 0-based
  std::int64_t step_in_epoch = 0;  // steps of that epoch already done
  std::int64_t global_step = 0;    // optimizer steps since the run began
  double best_top1 = -1;           // best validation top-1 so far, percent
  std::int64_t best_epoch = -1;    // its epoch (1-based); -1: none yet
};

// Everything a run keeps from setup to its last checkpoint. Built in three
// phases so that bad input fails before the workspace is touched:
// build_run (flags, data, weights, resume state), plan_steps (epoch length,
// LR schedule, the resumed position), open_workspace (the first write).
struct TrainingRun {
  TrainingRun(const TrainConfig& config, const RunOptions& options, const ArchInfo& arch)
      : config(config), options(options), arch(arch) {}

  const TrainConfig& config;
  const RunOptions& options;
  const ArchInfo& arch;
  const runtime::Checkpoint* resume = nullptr;  // options.resume, when resuming

  // Processes: a data-parallel group (owned by run_training, so it can name a
  // failed rank to the others after this run is gone) or none.
  runtime::Runtime rt;
  distributed::Group* group = nullptr;
  const distributed::WorkerEnv* worker = nullptr;
  int world = 1;
  int rank = 0;
  bool writer = true;  // rank 0 writes checkpoints, logs and progress

  // Data: DLE's --optimizer-batch-size counts every process's images.
  Preprocessing pre;
  data::DatasetPtr train_data, val_data;  // val_data null with --training-only
  std::unique_ptr<data::Loader> train_loader, val_loader;  // train_loader null with --evaluate
  std::size_t bad_files_logged = 0;  // train_loader->bad_files() already in log.json
  std::int64_t micro_per_step = 1;
  std::int64_t optimizer_batch = 0;  // images per optimizer step, all processes
  int load_size = 0;                 // the loader's output size (the teacher's with --teacher-img-size)

  // Model and the state of its training.
  std::int64_t num_classes = 0;
  Network model;
  Network teacher;  // null without distillation
  Preprocessing teacher_pre;                          // what it was trained with; --teacher-img-size sets the size
  std::unique_ptr<data::Loader> teacher_val_loader;   // --test-teacher
  std::unique_ptr<Optimizer> optimizer;
  std::unique_ptr<distributed::GradientReducer> reducer;  // data-parallel runs
  std::unique_ptr<LossScaler> scaler;                     // amp
  std::unique_ptr<Ema> ema;                               // --ema
  AspOptimizer* asp = nullptr;                            // --asp: `optimizer`, which keeps the 2:4 masks
  std::shared_ptr<const quant::Plan> quant;               // --qat: the fake quantization's ranges
  std::string fused_bn;  // which BN layers and blocks run fused (runtime::set_fusion, describe_fusion)
  std::string tuning;    // what the step tuner chose and why (runtime::tune_fusion)
  RunPosition position;
  bool stopped_early = false;  // --early-stopping-patience ended the epochs before --epochs

  // Set by plan_steps.
  std::int64_t steps_per_epoch = 0;
  double base_lr = 0;  // --lr after linear scaling to the optimizer batch
  std::optional<LrSchedule> schedule;

  // Set by open_workspace.
  std::string last_path;                  // WORKSPACE/last.safetensors
  nlohmann::ordered_json resolved_config;  // the config as run, in every checkpoint
  std::unique_ptr<DlLogger> log;          // rank 0
  std::unique_ptr<report::EventWriter> tensorboard;  // rank 0, --tensorboard
  // Mid-epoch checkpoints (--checkpoint-interval, --checkpoint-every-steps): rank 0's writer, null when off.
  std::unique_ptr<runtime::BackgroundSaver> saver;
  double checkpoint_interval_s = 0;  // 0: none by time
  std::chrono::steady_clock::time_point last_saved;  // the last checkpoint's snapshot, or the run's start
};

// Validates the config, connects the data-parallel group (first, so a rank
// that fails later reaches the others as a named failure), opens the data,
// builds the model with its weights (--resume, --fine-tune), optimizer,
// reducer, loss scaler, teacher and EMA, restores a resumed run's state, and
// makes the loaders. Writes nothing. Throws Error naming the flag or file.
TrainingRun build_run(const TrainConfig& config, const RunOptions& options,
                      std::unique_ptr<distributed::Group>& group);

// Steps per epoch and the LR schedule; a resumed position is converted to
// this run's step size (another world size or batch) through the images
// consumed. Throws Error when the epoch is shorter than one step or the
// position falls between this run's steps.
void plan_steps(TrainingRun& run);

// --asp: prunes the weights to 2:4 at the start of `epoch` once
// --asp-dense-epochs are done, unless the masks are already there (restored
// by --resume); zeroes the same weights of the EMA.
void prune_when_due(TrainingRun& run, std::int64_t epoch);

// Whether best.safetensors follows the EMA's top-1 (--best-by, with an EMA).
bool best_by_ema(const TrainingRun& run);

}  // namespace convnets::train
