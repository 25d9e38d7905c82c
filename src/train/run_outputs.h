// What a training run leaves behind: its workspace (config.json, log.json, summary.csv, TensorBoard's events), the lines that say what is about to be trained, and its checkpoints.
#pragma once

#include "train/run.h"

#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>

namespace convnets::train {

// Refuses a workspace that holds another run, then writes config.json and
// opens log.json (appending when resuming) with the parameters and metric
// metadata. Rank 0 only; other ranks get the paths alone.
// `log_lock`: the log's lock when the caller took it before build_run.
void open_workspace(TrainingRun& run, LogLock log_lock = {});

// The lines that say what is about to be trained (rank 0).
void print_run_summary(const TrainingRun& run);

// Model, EMA, optimizer, loss-scale and RNG state plus the run's metadata at
// run.position; rank 0 writes, the others hold the same state; nothing with
// --no-checkpoints.
// Waits first for a write in flight in the background, so that files appear in the order of the steps they hold.
void save_run(const TrainingRun& run, const std::string& path);

// Whether a mid-epoch checkpoint is due after the step just run (run.position): --checkpoint-every-steps, or
// --checkpoint-interval minutes since the last one. Always false without run.saver (other ranks, options off).
bool checkpoint_due(const TrainingRun& run);

// save_run's state snapshotted to host memory now and written to run.last_path by run.saver's thread while the
// training goes on; prints a line when it had to wait for the previous write.
void save_run_in_background(TrainingRun& run);

// A DLLogger entry of the running epoch (step [epoch, iteration]) or of its
// end ([epoch]) into log.json and, with --tensorboard, as scalars at the
// global optimizer step: per-step entries under their DLLogger names
// (train.loss, train.lr, ...), epoch entries' validation figures likewise
// (val.top1, val_ema.top1, ...) and their training means as epoch/train.*.
void log_metrics(TrainingRun& run, const nlohmann::json& step, const nlohmann::ordered_json& data);

// timm's summary.csv (train.py's update_summary) in the workspace, rank 0: a
// row per epoch (counted from 1 as in log.json) of an epoch's entry, for the
// spreadsheets and scripts that read timm's output folders. A resumed run
// logs its epochs again: the rows from `epoch` on were the interrupted run's
// and are replaced.
void update_summary_csv(const TrainingRun& run, std::int64_t epoch, const nlohmann::ordered_json& data);

// --tensorboard: the first training batch as images (after augmentation,
// before normalisation), up to 8, at step 0.
void log_images(TrainingRun& run, const at::Tensor& images);

}  // namespace convnets::train
