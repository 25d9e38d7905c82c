#include "train/workspace.h"

#include "core/error.h"

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <utility>

namespace convnets::train {
namespace fs = std::filesystem;

namespace {

std::string folder_of(const std::string& path) {
  const auto parent = fs::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// --resume auto's candidates, `last` first, and why each it passed over was no run to continue.
struct AutoResume {
  std::optional<runtime::Checkpoint> found;
  std::vector<std::string> skipped;  // "PATH: why", newest first
};

AutoResume find_resumable(const std::string& workspace, const std::string& key_layout) {
  AutoResume r;
  const auto last = last_checkpoint_path(workspace);
  std::vector<std::string> candidates;
  if (fs::exists(last)) candidates.push_back(last);
  if (fs::is_directory(workspace)) {
    for (auto& other : other_checkpoints(last)) candidates.push_back(std::move(other));
  }
  for (const auto& path : candidates) {
    try {
      auto ckpt = runtime::load_checkpoint(path, key_layout);
      // Weights put in the workspace by hand (an export, a download) are not a run's state.
      if (!ckpt.is_training_checkpoint()) continue;
      r.found = std::move(ckpt);
      break;
    } catch (const Error& e) {
      r.skipped.push_back(path + ": " + e.what());
    }
  }
  return r;
}

}  // namespace

std::string last_checkpoint_path(const std::string& workspace) {
  return (fs::path(workspace) / "last.safetensors").string();
}

std::vector<std::string> other_checkpoints(const std::string& path) {
  std::vector<std::pair<fs::file_time_type, std::string>> found;
  std::error_code ec, ignored;
  const fs::path self(path);
  for (const auto& e : fs::directory_iterator(folder_of(path), ec)) {
    // PATH.tmp.PID files, half-written by an interrupted save, end otherwise.
    if (e.path().extension() != ".safetensors" || !e.is_regular_file(ignored) || fs::equivalent(e.path(), self, ignored))
      continue;
    found.emplace_back(e.last_write_time(ignored), e.path().string());
  }
  std::sort(found.rbegin(), found.rend());
  std::vector<std::string> out;
  for (auto& f : found) out.push_back(std::move(f.second));
  return out;
}

runtime::Checkpoint load_resume_checkpoint(const std::string& path, const std::string& key_layout) {
  try {
    return runtime::load_checkpoint(path, key_layout);
  } catch (const Error& e) {
    const auto others = other_checkpoints(path);
    std::string hint = e.hint().empty() ? "" : e.hint() + "; ";
    if (others.empty()) {
      hint += "no other checkpoint is in " + folder_of(path) + ": start a new run (another --workspace)";
    } else {
      hint += "resume from another checkpoint of the run instead (the epochs after it are trained again), newest "
              "first: " + join(others) + "; e.g. --resume " + others.front();
    }
    throw Error("--resume " + path + ": " + e.what(), hint);
  }
}

JobRestart job_restart() {
  for (const auto& [var, by] : {std::pair{"TORCHELASTIC_RESTART_COUNT", "torchrun's restart "},
                                std::pair{"SLURM_RESTART_COUNT", "Slurm's requeue "}}) {
    const char* text = std::getenv(var);
    if (const long count = text ? std::strtol(text, nullptr, 10) : 0; count > 0) return {count, by};
  }
  return {};
}

std::string torchrun_job() {
  const char* id = std::getenv("TORCHELASTIC_RUN_ID");
  return id == nullptr || std::string(id) == "none" ? "" : id;
}

ResumeChoice choose_resume(const std::string& resume, const std::string& workspace, const std::string& key_layout,
                           const std::string& job, const JobRestart& restart) {
  ResumeChoice choice;
  std::optional<AutoResume> searched;
  bool automatic = resume == "auto";
  if (resume.empty() && (!job.empty() || restart.count > 0)) {
    if (!job.empty()) {
      // Its workers wait for each other before anything is saved, so a first start finds none of its own.
      searched = find_resumable(workspace, key_layout);
      if (const auto& found = searched->found) {
        const std::string written_by = found->meta.value("torchrun_job", std::string());
        if (written_by != job) {
          throw Error("torchrun job " + job + ": the newest checkpoint in " + workspace + " that verifies, " +
                          found->path + ", is " +
                          (written_by.empty() ? "no torchrun job's" : "torchrun job " + written_by + "'s"),
                      "give the job its own --workspace, or --resume that checkpoint by name to continue it");
        }
      }
    }
    automatic = true;
    const std::string restarted = restart.count > 0 ? restart.by + std::to_string(restart.count) : "";
    choice.said.push_back("resume: " +
                          (job.empty() ? restarted : "torchrun job " + job + (restarted.empty() ? "" : ", " + restarted)) +
                          ": --resume auto");
  }
  if (!automatic) {
    if (!resume.empty()) {
      choice.checkpoint = load_resume_checkpoint(resume, key_layout);
      choice.path = resume;
    }
    return choice;
  }
  auto r = searched ? std::move(*searched) : find_resumable(workspace, key_layout);
  for (const auto& s : r.skipped) choice.said.push_back("resume: auto: skipped " + s);
  if (r.found) {
    choice.path = r.found->path;
    choice.checkpoint = std::move(r.found);
    choice.said.push_back("resume: auto: " + choice.path + ", the newest checkpoint in " + workspace +
                          " that verifies");
  } else if (!r.skipped.empty()) {
    // Starting anew would overwrite them: what is written is never lost to an automatic choice.
    throw Error("--resume auto: none of the " + std::to_string(r.skipped.size()) + " checkpoints in " + workspace +
                    " loads (first: " + r.skipped.front() + ")",
                "move the damaged files out of the workspace to start anew, or --resume one of them by name");
  } else {
    choice.take_over_left_log = true;
    choice.said.push_back("resume: auto: " + workspace + " holds no checkpoint; a new run starts");
  }
  return choice;
}

void prune_epoch_checkpoints(const std::string& workspace, std::int64_t keep) {
  if (keep <= 0) return;
  std::vector<std::pair<std::int64_t, fs::path>> found;
  for (const auto& e : fs::directory_iterator(workspace)) {
    const auto name = e.path().filename().string();
    if (name.rfind("epoch-", 0) == 0 && e.path().extension() == ".safetensors") {
      try {
        found.emplace_back(std::stoll(name.substr(6)), e.path());
      } catch (const std::exception&) {
      }
    }
  }
  std::sort(found.begin(), found.end());
  for (std::size_t i = 0; i + static_cast<std::size_t>(keep) < found.size(); ++i) fs::remove(found[i].second);
}

}  // namespace convnets::train
