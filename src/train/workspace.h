// A run's workspace and its checkpoints: where `last` is, which others remain and in what order, the one --resume (auto) continues, the torchrun job that owns them, and the epoch checkpoints --keep prunes.
#pragma once

#include "runtime/checkpoint.h"

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace convnets::train {

// WORKSPACE/last.safetensors: what every save writes and a resume continues.
std::string last_checkpoint_path(const std::string& workspace);

// The other checkpoints beside `path` (best, epoch-N), newest first by their times; half-written PATH.tmp.PID
// files are not among them.
std::vector<std::string> other_checkpoints(const std::string& path);

// --resume PATH: the checkpoint, or an Error that names what is wrong with it and the checkpoints that remain,
// newest first (a damaged `last` must not leave the user guessing).
runtime::Checkpoint load_resume_checkpoint(const std::string& path, const std::string& key_layout);

// A restarted job's count and who restarted it: torchrun's elastic agent (TORCHELASTIC_RESTART_COUNT) or Slurm's
// --requeue (SLURM_RESTART_COUNT); a count of 0 on a first start and outside both.
struct JobRestart {
  long count = 0;
  std::string by;  // "torchrun's restart ", "Slurm's requeue "
};
JobRestart job_restart();

// torchrun's job id (TORCHELASTIC_RUN_ID, from --rdzv-id); empty outside torchrun and for its default "none", which
// every job without --rdzv-id shares.
std::string torchrun_job();

// What --resume (as given, "auto", or absent) comes to in `workspace`, with the lines rank 0 says about it.
struct ResumeChoice {
  std::optional<runtime::Checkpoint> checkpoint;  // none: a new run
  std::string path;                               // the checkpoint's, for the messages that name it
  bool take_over_left_log = false;                // --resume auto found no checkpoint: a new run in its place
  std::vector<std::string> said;                  // "resume: auto: ...", in order
};

// The run's checkpoint to continue:
// - PATH: that file (load_resume_checkpoint).
// - auto: `last`, then the others newest first, the first that loads and verifies (io/safetensors.h's checksums)
//   and is a run's (weights put in the workspace by hand are not); none at all: a new run; only damaged ones: an
//   Error, since starting anew would overwrite them.
// - absent: auto on a restart (`restart`), and on every start of a torchrun job with a name (`job`), whose
//   newest verifying checkpoint must then be that job's: an agent that joins a running job starts its worker at
//   restart 0, so every worker decides by the workspace alike.
ResumeChoice choose_resume(const std::string& resume, const std::string& workspace, const std::string& key_layout,
                           const std::string& job, const JobRestart& restart);

// Removes the oldest epoch-N checkpoints of `workspace` beyond the newest `keep` (0: keeps all).
void prune_epoch_checkpoints(const std::string& workspace, std::int64_t keep);

}  // namespace convnets::train
