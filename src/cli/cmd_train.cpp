// `convnets train`: recipe + flag overrides -> TrainConfig, resume/fine-tune wiring, then the training run.
#include "cli/commands.h"
#include "cli/launch.h"
#include "core/error.h"
#include "core/json.h"
#include "models/registry.h"
#include "runtime/checkpoint.h"
#include "runtime/runtime.h"
#include "train/config.h"
#include "train/trainer.h"

#include <CLI/CLI.hpp>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <map>
#include <optional>
#include <memory>
#include <sstream>

namespace convnets::cli {
namespace {

struct TrainArgs {
  std::string data, recipe, resume, fine_tune, key_layout = "auto";
  bool print_config = false;
  std::map<std::string, std::string> values;  // field -> text of the flag given
  // timm's --drop / --drop-connect: model options that DLE's gpunet_*
  // constructors ignore (see apply_timm_model_options).
  std::optional<double> timm_drop, timm_drop_connect;
  // timm's train.py defaults that its flags imply (--sched, --model-ema): they
  // fill only fields that no resumed run, recipe or flag set.
  nlohmann::json timm_defaults = nlohmann::json::object();
  std::optional<bool> enable_distill;  // GPUNet's --enable-distill True|False
  bool dynamic_loss_scale = false;     // DLE's --dynamic-loss-scale: it wins over --static-loss-scale
  std::string tensorboard_folder;      // the DIR of --tensorboard [DIR], if one was given
  // DLE's launch.py: --mode's preset fills fields no flag set (over the recipe's), --platform picks the recipe.
  nlohmann::json mode_defaults = nlohmann::json::object();
  std::string platform;
  nlohmann::json flags = nlohmann::json::object();
  distributed::LaunchOptions launch;
};

// The flag's text parsed as the field's type (that of its default value).
nlohmann::json parse_value(const std::string& field, const nlohmann::json& like, const std::string& text) {
  const std::string flag = train::flag_for(field);
  try {
    std::size_t used = 0;
    if (like.is_number_integer()) {
      const long long v = std::stoll(text, &used);
      if (used == text.size()) return v;
    } else if (like.is_number()) {
      const double v = std::stod(text, &used);
      if (used == text.size()) return v;
    } else if (like.is_array()) {
      nlohmann::json out = nlohmann::json::array();
      std::stringstream in(text);
      std::string item;
      while (std::getline(in, item, ',')) {
        if (item.empty()) continue;
        const double v = std::stod(item, &used);
        if (used != item.size()) throw std::invalid_argument(item);
        out.push_back(v);
      }
      return out;
    } else {
      return text;
    }
  } catch (const std::exception&) {
  }
  throw Error(flag + " expects " + (like.is_number_integer() ? "an integer" : like.is_array() ? "numbers separated by commas" : "a number") +
              ", got '" + text + "'");
}

// timm's train.py hands --drop and --drop-connect to create_model; DLE's
// gpunet_* constructors take **kwargs and build from the JSON definition
// without reading them, so on a GPUNet they change nothing, here as there.
void apply_timm_model_options(const TrainArgs& a, nlohmann::json& overrides, const std::string& arch) {
  if (!a.timm_drop && !a.timm_drop_connect) return;
  if (find_architecture(arch).gpunet) {
    std::cerr << "convnets: note: --drop/--drop-connect are ignored for " << arch
              << ", as DLE's GPUNet train.py ignores them (its gpunet_* build from the JSON definition); "
                 "--dropout and --drop-path set them\n";
    return;
  }
  auto given = [&a](const char* field) { return a.values.count(field) > 0 || a.flags.contains(field); };
  if (a.timm_drop && !given("dropout")) overrides["dropout"] = *a.timm_drop;
  if (a.timm_drop_connect && !given("drop_path")) overrides["drop_path"] = *a.timm_drop_connect;
}

std::string folder_of(const std::string& path) {
  const auto parent = std::filesystem::path(path).parent_path();
  return parent.empty() ? "." : parent.string();
}

// The other checkpoints beside `path` (best, epoch-N), newest first.
std::vector<std::string> other_checkpoints(const std::string& path) {
  namespace fs = std::filesystem;
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

// A damaged `last` (a copy cut short, a disk that failed under it) must not
// leave the user guessing: name what is wrong and the checkpoints that remain.
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

// --resume auto: `last` (each save writes it; best and epoch-N are copies of earlier ones), then the others newest
// first; the first that loads and verifies (io/safetensors.h's checksums). torchrun's elastic restarts ask exactly
// this of a script: on start, load the latest checkpoint.
struct AutoResume {
  std::optional<runtime::Checkpoint> found;
  std::vector<std::string> skipped;  // "PATH: why", newest first
};

AutoResume find_resumable(const std::string& workspace, const std::string& key_layout) {
  AutoResume r;
  const auto last = train::last_checkpoint_path(workspace);
  std::vector<std::string> candidates;
  if (std::filesystem::exists(last)) candidates.push_back(last);
  if (std::filesystem::is_directory(workspace)) {
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

// A restarted job's count and who restarted it: torchrun's elastic agent (TORCHELASTIC_RESTART_COUNT) or Slurm's
// --requeue (SLURM_RESTART_COUNT); 0 on a first start and outside both.
std::pair<long, std::string> job_restart() {
  for (const auto& [var, who] : {std::pair{"TORCHELASTIC_RESTART_COUNT", "torchrun's restart "},
                                 std::pair{"SLURM_RESTART_COUNT", "Slurm's requeue "}}) {
    const char* text = std::getenv(var);
    if (const long count = text ? std::strtol(text, nullptr, 10) : 0; count > 0) return {count, who};
  }
  return {0, ""};
}

// torchrun's job id (TORCHELASTIC_RUN_ID, from --rdzv-id); empty outside torchrun and for its default "none", which
// every job without --rdzv-id shares.
std::string torchrun_job() {
  const char* id = std::getenv("TORCHELASTIC_RUN_ID");
  return id == nullptr || std::string(id) == "none" ? "" : id;
}

// DLE's launch.py --platform DGXA100: configs.yml's DGXA100 block for the --model, which is what the built-in
// <arch>-250ep recipes hold (model block: 250 epochs, mixup 0.2; DGXA100: the per-GPU batch). The other
// platforms' batch sizes and worker counts are not carried.
void check_platform(const std::string& platform) {
  if (platform != "DGXA100") {
    throw Error("--platform " + platform + ": convnets carries DLE's DGXA100 configurations only (its built-in "
                "recipes *-250ep), not " + platform + "'s",
                "use --platform DGXA100, or --recipe resnet50-250ep with the --batch-size and --workers your GPU takes");
  }
}

std::string platform_recipe(const TrainArgs& a) {
  const auto arch = a.values.count("arch") ? a.values.at("arch") : std::string("resnet50");
  std::string recipe = arch;
  std::replace(recipe.begin(), recipe.end(), '_', '-');
  recipe += "-250ep";
  const auto known = train::builtin_recipes();
  if (std::find(known.begin(), known.end(), recipe) == known.end()) {
    throw Error("--platform DGXA100 --model " + arch + ": DLE's configs.yml has no configuration for it",
                "its models: resnet50, resnext101-32x4d, se-resnext101-32x4d; or name a --recipe");
  }
  return recipe;
}

int run(TrainArgs& a) {
  train::TrainConfig config;
  train::RunOptions options;
  options.command = "convnets train";
  // Every rank resolves --resume auto alike (the same files); rank 0 says what it found.
  const char* rank = std::getenv("RANK");
  const bool speak = rank == nullptr || std::string(rank) == "0";
  auto say = [speak](const std::string& line) {
    if (speak) std::cout << line << '\n';
  };
  const std::string workspace = a.values.count("workspace") ? a.values.at("workspace") : train::TrainConfig{}.workspace;
  options.torchrun_job = torchrun_job();
  std::optional<AutoResume> searched;
  const auto [count, who] = job_restart();
  const std::string& job = options.torchrun_job;
  if (a.resume.empty() && (!job.empty() || count > 0)) {
    if (!job.empty()) {
      // A restart count is its agent's own: an agent that joins a running job starts its worker at 0, and a world
      // grown by one is no restart for those already in it. So every worker of a job with a name decides by the
      // workspace alike: --resume auto, the newest checkpoint that verifies being this job's (its workers wait for
      // each other before anything is saved, so a first start finds none of its own).
      searched = find_resumable(workspace, a.key_layout);
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
    a.resume = "auto";
    const std::string restart = count > 0 ? who + std::to_string(count) : "";
    say("resume: " + (job.empty() ? restart : "torchrun job " + job + (restart.empty() ? "" : ", " + restart)) +
        ": --resume auto");
  }
  if (a.resume == "auto") {
    auto r = searched ? std::move(*searched) : find_resumable(workspace, a.key_layout);
    for (const auto& s : r.skipped) say("resume: auto: skipped " + s);
    if (r.found) {
      options.resume = std::move(r.found);
      a.resume = options.resume->path;
      say("resume: auto: " + a.resume + ", the newest checkpoint in " + workspace + " that verifies");
    } else if (!r.skipped.empty()) {
      // Starting anew would overwrite them: what is written is never lost to an automatic choice.
      throw Error("--resume auto: none of the " + std::to_string(r.skipped.size()) + " checkpoints in " + workspace +
                      " loads (first: " + r.skipped.front() + ")",
                  "move the damaged files out of the workspace to start anew, or --resume one of them by name");
    } else {
      a.resume.clear();
      options.take_over_left_log = true;
      say("resume: auto: " + workspace + " holds no checkpoint; a new run starts");
    }
  } else if (!a.resume.empty()) {
    options.resume = load_resume_checkpoint(a.resume, a.key_layout);
  }
  if (options.resume) {
    // A DLE checkpoint.pth.tar is read once the command line has named its --arch (DLE's main.py keeps no arch).
    if (!options.resume->is_training_checkpoint() && !options.resume->torch_save) {
      throw Error("--resume " + a.resume + " is a weights file, not a training checkpoint",
                  "use --fine-tune to start a new run from weights");
    }
    if (options.resume->is_training_checkpoint())
      train::apply_json(config, options.resume->meta.at("config"), a.resume + " (config)");
  }
  if (!a.platform.empty()) {
    check_platform(a.platform);
    if (a.recipe.empty()) a.recipe = platform_recipe(a);
  }
  nlohmann::json recipe = nlohmann::json::object();
  if (!a.recipe.empty()) {
    recipe = train::load_recipe(a.recipe);
    train::apply_json(config, recipe, "--recipe " + a.recipe);
  }
  const auto defaults = train::to_json(train::TrainConfig{});
  nlohmann::json overrides = a.flags;
  for (const auto& [field, text] : a.values) overrides[field] = parse_value(field, defaults.at(field), text);
  if (!a.data.empty()) overrides["data"] = a.data;
  if (a.dynamic_loss_scale) overrides["static_loss_scale"] = 0;  // convnets' 0: dynamic
  for (const auto& [field, value] : a.mode_defaults.items())
    if (!overrides.contains(field)) overrides[field] = value;
  if (!a.platform.empty()) {
    // A DGX A100 is 8 GPUs: configs.yml's optimizer batch is 8 x the per-GPU batch, which DLE accumulates to on
    // fewer GPUs (so the LR is 8 GPUs' too); its TF32 block leaves main.py's NCHW, only AMP's sets NHWC.
    if (!overrides.contains("optimizer_batch_size")) overrides["optimizer_batch_size"] = 8 * config.batch_size;
    const std::string precision = overrides.value("precision", config.precision);
    if (!overrides.contains("memory_format") && precision != "amp") overrides["memory_format"] = "nchw";
  }
  // DLE's --lr is absolute: a recipe's per-reference-batch LR does not scale
  // an LR given on the command line unless --lr-reference-batch is given too.
  if (overrides.contains("lr") && !overrides.contains("lr_reference_batch")) overrides["lr_reference_batch"] = 0;
  if (!options.resume) {
    for (const auto& [field, value] : a.timm_defaults.items())
      if (!overrides.contains(field) && !recipe.contains(field)) overrides[field] = value;
  }
  if (a.enable_distill && !*a.enable_distill) {
    // GPUNet's --enable-distill False: no teacher, whatever else names one.
    overrides["teacher"] = overrides["teacher_checkpoint"] = "";
    overrides["teacher_img_size"] = 0;
    overrides["teacher_two_res"] = overrides["test_teacher"] = false;
  }
  const double planned_epochs = config.epochs;
  train::apply_json(config, overrides, "flags");
  // A resumed run's --prof limited its training; evaluating its checkpoint covers the whole set unless this
  // command line limits it (DLE's --evaluate --prof N: N batches).
  if (config.evaluate && options.resume && !overrides.contains("prof")) config.prof = 0;
  if (options.resume && options.resume->torch_save) {
    options.resume = runtime::import_dle_checkpoint(*options.resume, find_architecture(config.arch));
    std::cout << "resume: " << a.resume << " is DLE's checkpoint after epoch " << options.resume->meta.at("epoch")
              << " (best top-1 " << options.resume->meta.at("best_top1") << "); its weights, momentum"
              << (options.resume->has_ema() ? ", EMA" : "") << " continue as " << config.arch << '\n';
  }
  options.evaluation_log = config.evaluate && overrides.contains("raport_file");
  if (!a.values.count("warmup") && !a.flags.contains("warmup")) {
    if (const auto note = train::fit_warmup(config, planned_epochs); !note.empty())
      std::cerr << "convnets: note: " << note << "\n";
  }
  nlohmann::json model_options = nlohmann::json::object();
  apply_timm_model_options(a, model_options, config.arch);
  if (!model_options.empty()) train::apply_json(config, model_options, "flags");
  options.optimizer_batch_given = overrides.contains("optimizer_batch_size");
  options.fine_tune = a.fine_tune;
  options.key_layout = a.key_layout;
  if (a.print_config) {
    train::TrainConfig checked = config;
    if (checked.data.empty()) checked.data = "-";  // the data is only read by the run
    train::validate(checked);
    std::cout << dump_json(train::to_json(train::with_arch_defaults(config)), 2) << '\n';
    return 0;
  }
  if (config.data.empty() && !a.tensorboard_folder.empty()) {
    // An optional value takes the word after it: here that was DATA.
    throw Error("no training data given: --tensorboard took '" + a.tensorboard_folder + "' as its folder",
                "put DATA before --tensorboard, or write --tensorboard --tensorboard-dir DIR");
  }
  train::validate(config);  // once, in the launcher, rather than once per worker
  runtime::check_runtime(config.device, config.precision);
  return launch_or_run(a.launch, [&](const distributed::WorkerEnv* worker) {
    if (worker) options.dist = *worker;
    return train::run_training(config, options);
  });
}

}  // namespace

void add_train_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("train", "Train a model on a folder of images (DLE ResNet-50 v1.5 recipe by default)");
  auto args = std::make_shared<TrainArgs>();
  cmd->add_option("DATA", args->data, "training data (folder with train/ and val/, class folders, list file, IDX folder)");
  // A repeated flag overrides the earlier one, as with argparse in DLE's main.py.
  const auto last = CLI::MultiOptionPolicy::TakeLast;
  cmd->add_option("--recipe", args->recipe,
                  "built-in recipe (" + join(train::builtin_recipes()) + ") or a JSON file, flags override its fields")
      ->multi_option_policy(last);
  cmd->add_option("--resume", args->resume,
                  "continue the run saved in this checkpoint (e.g. WORKSPACE/last.safetensors); auto: the newest in "
                  "--workspace that verifies, or a new run where it holds none (the default on torchrun's restarts and Slurm's requeues)")
      ->multi_option_policy(last);
  cmd->add_option("--fine-tune,--pretrained-from-file", args->fine_tune,
                  "start from these weights, a new classifier for another class count (DLE: --pretrained-from-file)")
      ->multi_option_policy(last);
  add_key_layout_option(cmd, args->key_layout);
  cmd->add_flag("--print-config", args->print_config,
               "print the resolved configuration (recipe, resume and flags) as JSON and exit; DATA may be left out");
  // DLE's main.py spellings beside convnets' own (the same field, DLE's meaning).
  cmd->add_flag_callback("--amp", [args] { args->flags["precision"] = "amp"; }, "DLE: --precision amp");
  cmd->add_option_function<std::int64_t>(
         "--gather-checkpoints",
         [args](std::int64_t n) {
           // DLE writes checkpoint_NNNN every epoch and keeps the last N (0: all;
           // -1: none survive). Bare, as older main.py took it: all.
           args->flags["save_every"] = n < 0 ? 0 : 1;
           args->flags["keep"] = n < 0 ? 0 : n;
         },
         "DLE: keep an epoch-N checkpoint of every epoch, the last N of them (0 or bare: all; -1: none)")
      ->expected(0, 1)
      ->default_str("0");
  // DLE's -c/--model-config (image_classification/models/resnet.py's resnet_configs): they differ only in the
  // convolutions' Kaiming mode; none zeroes the last BN of a block.
  cmd->add_option_function<std::string>(
         "-c,--model-config",
         [args](const std::string& config) {
           args->flags["init"] = config == "classic" || config == "grp-fanout" ? "fan_out" : "fan_in";
         },
         "DLE: classic | grp-fanout (Kaiming fan_out init) or fanin | grp-fanin (fan_in): --init")
      ->check(CLI::IsMember({"classic", "fanin", "grp-fanin", "grp-fanout"}));
  auto truth = [](const std::string& flag, const std::string& v) {
    if (v == "True" || v == "true" || v == "1") return true;
    if (v == "False" || v == "false" || v == "0") return false;
    throw Error(flag + " " + v + ": expected True or False",
                "a value that is neither is read as the flag's: put DATA before " + flag + ", or write " + flag + " True");
  };
  // DLE's model parser (image_classification/models/resnet.py) since the seed: --conv_init is -c's Kaiming mode,
  // --last_bn_0_init zeroes each block's last BN (read as True/False, where DLE's type=bool takes "False" as true).
  cmd->add_option_function<std::string>(
         "--conv_init", [args](const std::string& mode) { args->flags["init"] = mode; },
         "DLE: fan_in | fan_out, the convolutions' Kaiming mode: --init")
      ->check(CLI::IsMember({"fan_in", "fan_out"}));
  cmd->add_option_function<std::string>(
      "--last_bn_0_init",
      [args, truth](const std::string& v) { args->flags["zero_init_residual"] = truth("--last_bn_0_init", v); },
      "DLE: True zeroes the last BN of each residual branch: --zero-init-residual");
  // DLE's launch.py (configs.yml): a mode block of fields under the flags given, and the platform's configuration.
  cmd->add_option_function<std::string>(
         "--mode",
         [args](const std::string& mode) {
           auto& m = args->mode_defaults;
           m = nlohmann::json::object();
           const bool benchmark = mode.rfind("benchmark_", 0) == 0;
           m["print_freq"] = benchmark ? 1 : 20;
           m["checkpoints"] = mode == "convergence";
           if (mode == "benchmark_training" || mode == "benchmark_training_short") {
             m["epochs"] = mode == "benchmark_training" ? 3 : 1;
             m["training_only"] = true;
           }
           if (mode == "benchmark_training_short") m["data_backend"] = "synthetic", m["prof"] = 100;
           if (mode == "benchmark_inference" || mode == "evaluate") m["evaluate"] = true, m["epochs"] = 1;
         },
         "DLE launch.py: benchmark_training (3 epochs, training only, no checkpoints, -p 1) | "
         "benchmark_training_short (1 epoch of 100 synthetic batches) | benchmark_inference (--evaluate, -p 1) | "
         "evaluate | convergence; flags given win")
      ->check(CLI::IsMember(
          {"benchmark_training", "benchmark_training_short", "benchmark_inference", "evaluate", "convergence"}));
  cmd->add_option("--platform", args->platform,
                  "DLE launch.py: DGXA100 reads the --model's built-in *-250ep recipe with 8 GPUs' optimizer batch "
                  "(configs.yml's DGXA100 values); other platforms are refused");
  // What torch.distributed.launch passes each process; convnets reads LOCAL_RANK, which it sets only when absent.
  cmd->add_option_function<int>(
      "--local_rank,--local-rank",
      [](int rank) {
        const std::string value = std::to_string(rank);
        const char* env = std::getenv("LOCAL_RANK");
        if (env && value != env) {
          throw Error("--local_rank " + value + " disagrees with LOCAL_RANK=" + env,
                      "launch with one of them: torchrun sets LOCAL_RANK, torch.distributed.launch passes both");
        }
        ::setenv("LOCAL_RANK", value.c_str(), 0);
      },
      "torch.distributed.launch: this process's GPU (as the LOCAL_RANK variable)");
  cmd->add_flag_callback(
      "--dynamic-loss-scale", [args] { args->dynamic_loss_scale = true; },
      "DLE: a dynamic loss scale (convnets' own, grown and backed off per step) instead of --static-loss-scale's fixed one");
  cmd->add_flag_callback(
      "--fp16",
      [] {
        throw Error("--fp16: convnets does not train in pure fp16 (DLE's fp16 model with fp32 master weights)",
                    "use --amp: mixed precision, fp16 compute with fp32 weights, the mode DLE's results use");
      },
      "DLE's pure-fp16 training: refused, use --amp");
  add_dle_model_refusals(cmd);
  cmd->add_option_function<std::string>(
         "--jit",
         [](const std::string& mode) {
           if (mode != "no") {
             throw Error("--jit " + mode + ": convnets is C++ on LibTorch; there is no TorchScript to compile the "
                         "model into",
                         "leave the flag out (DLE's default, --jit no): on CUDA the whole step already replays as one "
                         "CUDA graph (--cuda-graph)");
           }
         },
         "DLE: no (its default) | script (TorchScript), which is refused: the C++ step replays as one CUDA graph")
      ->check(CLI::IsMember({"no", "script"}));
  cmd->add_option_function<std::string>(
      "--checkpoint-filename",
      [](const std::string& name) {
        throw Error("--checkpoint-filename " + name + ": convnets names its checkpoints itself: last.safetensors "
                    "(each epoch; what --resume continues) and best.safetensors in --workspace",
                    "leave the flag out and point --workspace at the folder; --gather-checkpoints N keeps "
                    "epoch-N.safetensors too");
      },
      "DLE: the last checkpoint's file name; refused: convnets writes WORKSPACE/last.safetensors and best.safetensors");
  cmd->add_option_function<std::string>(
      "--gpu-affinity",
      [](const std::string& mode) {
        if (mode != "none") {
          throw Error("--gpu-affinity " + mode + ": convnets does not pin CPU cores to GPUs (DLE's NVML-based modes)",
                      "leave the flag out or pass none; pin processes with numactl or taskset");
        }
      },
      "DLE: CPU affinity per GPU; only none (no pinning) is available");
  // timm's train.py spellings (GPUNet's train.params), with timm's meaning.
  cmd->add_option_function<std::string>(
      "--sched",
      [args](const std::string& s) {
        if (s == "step") args->flags["lr_schedule"] = "staircase";
        else if (s == "cosine") args->flags["lr_schedule"] = "cosine";
        else throw Error("--sched " + s + ": convnets has timm's step (--lr-schedule staircase) and cosine schedules");
        // A timm command line leaves these at timm's train.py defaults, which
        // differ from convnets' (DLE's).
        args->timm_defaults["warmup"] = 3;
        args->timm_defaults["warmup_lr"] = 1e-4;
        args->timm_defaults["train_interpolation"] = "random";
      },
      "timm: step (decay by --decay-rate every --decay-epochs) | cosine; where no recipe or flag sets them, also "
      "timm's defaults --warmup-epochs 3, --warmup-lr 1e-4 and --train-interpolation random");
  cmd->add_option_function<std::string>(
      "--opt",
      [args](const std::string& s) {
        // timm's create_optimizer: "sgd" and "nesterov" are Nesterov SGD, "momentum" plain momentum SGD.
        if (s == "rmsproptf" || s == "rmsprop") args->flags["optimizer"] = s;
        else if (s == "sgd" || s == "nesterov") args->flags["optimizer"] = "sgd", args->flags["nesterov"] = true;
        else if (s == "momentum") args->flags["optimizer"] = "sgd", args->flags["nesterov"] = false;
        else throw Error("--opt " + s + ": convnets has timm's rmsproptf, rmsprop, sgd (Nesterov), nesterov and momentum");
      },
      "timm: rmsproptf | rmsprop (torch.optim.RMSprop) | sgd (Nesterov) | nesterov | momentum");
  cmd->add_option("--drop", args->timm_drop, "timm: dropout before the classifier (ignored for GPUNets, as DLE's train.py)");
  cmd->add_option("--drop-connect", args->timm_drop_connect,
                  "timm: drop-path rate (ignored for GPUNets, as DLE's train.py)");
  cmd->add_flag_callback(
      "--model-ema",
      [args] {
        // timm's ModelEmaV2: decay 0.9998 unless --model-ema-decay (or the recipe) says, no warm-up.
        args->timm_defaults["ema"] = 0.9998;
        args->flags["ema_warmup"] = false;
      },
      "timm: keep a weight EMA (decay --model-ema-decay or the recipe's, else 0.9998; no warm-up)");
  cmd->add_option_function<std::string>(
      "--enable-distill", [args, truth](const std::string& v) { args->enable_distill = truth("--enable-distill", v); },
      "GPUNet: True distils from --teacher, False trains without a teacher whatever else names one");
  cmd->add_option_function<std::string>(
         "--test-teacher", [args, truth](const std::string& v) { args->flags["test_teacher"] = truth("--test-teacher", v); },
         "GPUNet: validate the teacher before training: --test-teacher alone or True; False or absent: not")
      ->expected(0, 1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->default_str("True");
  cmd->add_option_function<std::string>(
         "--tensorboard",
         [args](const std::string& dir) {
           args->flags["tensorboard"] = true;
           if (!dir.empty()) args->flags["tensorboard_dir"] = args->tensorboard_folder = dir;
         },
         "also write TensorBoard event files: log.json's scalars, the config, the first batch's images; in DIR if "
         "given (default: WORKSPACE/tensorboard)")
      ->expected(0, 1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)  // the last flag wins, as for every other flag
      ->type_name("[DIR]");
  cmd->add_flag_callback("--no-tensorboard", [args] { args->flags["tensorboard"] = false; }, "turn off --tensorboard");
  // The switches --fusion replaced, with their meaning: what scripts written before it still pass.
  cmd->add_flag_callback("--no-fused-bn", [args] { args->flags["fusion"] = "none"; }, "--fusion none");
  cmd->add_flag_callback("--fused-bn", [args] { args->flags["fusion"] = "bn"; }, "--fusion bn");
  cmd->add_flag_callback("--norm-conv", [args] { args->flags["fusion"] = "normconv"; }, "--fusion normconv");
  cmd->add_flag_callback("--no-norm-conv", [args] { args->flags["fusion"] = "bn"; }, "--fusion bn");
  static const std::map<std::string, std::string> dle_aliases = {
      {"arch", "-a,--model"},   {"batch_size", "-b"}, {"workers", "-j"},     {"print_freq", "-p"},
      {"weight_decay", "--wd"}, {"lr", "--learning-rate"}, {"ema", "--use-ema,--model-ema-decay"}, {"top_k", "--topk"},
      {"num_classes", "--num_classes"}, {"opt_eps", "--rmsprop-eps"}, {"augment", "--augmentation,--aa"},
      {"lr_decay_epochs", "--decay-epochs"}, {"lr_step_factor", "--decay-rate"}, {"warmup", "--warmup-epochs"},
      {"crop_ratio", "--crop-pct"},
      {"image_size", "--img-size"}, {"label_smoothing", "--smoothing"}};
  add_launch_flags(cmd, args->launch);
  const auto defaults = train::to_json(train::TrainConfig{});
  for (auto it = defaults.begin(); it != defaults.end(); ++it) {
    const std::string field = it.key();
    // The positional DATA; --test-teacher [True|False] and --tensorboard [DIR] above.
    if (field == "data" || field == "test_teacher" || field == "tensorboard") continue;
    const std::string flag = train::flag_for(field);
    const std::string help = std::string(train::field_help(field)) + " [default " + it.value().dump() + "]";
    if (it.value().is_boolean()) {
      cmd->add_flag_callback(flag, [args, field] { args->flags[field] = true; }, help);
      cmd->add_flag_callback("--no-" + train::flag_for(field).substr(2), [args, field] { args->flags[field] = false; },
                             "turn off " + flag);
    } else {
      const auto& v = it.value();
      const auto alias = dle_aliases.find(field);
      auto* opt = cmd->add_option(alias == dle_aliases.end() ? flag : alias->second + "," + flag, args->values[field], help);
      // Any case, as classify and eval read it: launch.py writes AMP, TF32, FP32. The check stays train's own.
      if (field == "precision") opt->transform(lower_case);
      opt->expected(1)
          ->multi_option_policy(last)
          ->type_name(v.is_number_integer() ? "INT" : v.is_number() ? "NUMBER" : v.is_array() ? "N,N,.." : "TEXT");
    }
  }
  // Only fields whose flag was given override the recipe: drop the untouched entries.
  cmd->callback([cmd, args] {
    if (!args->tensorboard_folder.empty() && args->values.count("tensorboard_dir") &&
        cmd->get_option("--tensorboard-dir")->count() > 0 && args->values["tensorboard_dir"] != args->tensorboard_folder)
      throw Error("--tensorboard " + args->tensorboard_folder + " and --tensorboard-dir " +
                  args->values["tensorboard_dir"] + " name two folders", "give one of them");
    for (auto it = args->values.begin(); it != args->values.end();) {
      const auto* opt = cmd->get_option_no_throw(train::flag_for(it->first));
      it = (opt && opt->count() > 0) ? std::next(it) : args->values.erase(it);
    }
    const int code = run(*args);
    if (code != 0) std::exit(code);
  });
}

}  // namespace convnets::cli
