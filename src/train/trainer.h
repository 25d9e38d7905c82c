// `convnets train`: the training run (setup, epochs, validation, checkpoints, logs, interruption and resume).
#pragma once

#include "distributed/env.h"
#include "runtime/checkpoint.h"
#include "train/config.h"

#include <optional>
#include <string>

namespace convnets::train {

struct RunOptions {
  std::optional<runtime::Checkpoint> resume;  // continue this run (config already merged by the caller)
  std::string fine_tune;             // weights to start from, classifier re-initialised if the classes differ
  std::string key_layout = "auto";   // how --fine-tune's or --resume's foreign file names its tensors
  std::string command;               // how to re-run, for the resume hint
  std::optional<distributed::WorkerEnv> dist;  // a data-parallel worker (world size > 1)
  // --evaluate with --raport-file on its command line (DLE's benchmark): that DLLogger file in the workspace.
  // Without it an evaluation writes nothing (its workspace is usually the evaluated run's own).
  bool evaluation_log = false;
  // --resume auto found no checkpoint: a log left by a run that stopped before its first one (its lock free) is
  // set aside, named, instead of refusing the workspace.
  bool take_over_left_log = false;
  // --optimizer-batch-size on this command line: a resume on another world size takes it as given rather than
  // keeping the checkpoint's images per step (train/world_change.h).
  bool optimizer_batch_given = false;
  // torchrun's job (TORCHELASTIC_RUN_ID, its --rdzv-id), recorded in each checkpoint: a worker of an agent that joins
  // the job later knows by it that the workspace's checkpoints are its job's to resume.
  std::string torchrun_job;
};

// Exit code: 0 finished, 128 + signal when SIGINT/SIGTERM interrupted it
// (after finishing the step and saving `last`). Bad input throws Error before
// anything in the workspace is written.
int run_training(const TrainConfig& config, const RunOptions& options);

// `config` with the arch's own values where it leaves them to the arch (the
// dropout and drop-path rates, negative there): what --print-config,
// config.json and the report show is the value the network is built with.
TrainConfig with_arch_defaults(TrainConfig config);

}  // namespace convnets::train
