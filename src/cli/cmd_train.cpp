// `convnets train`: recipe + flag overrides -> TrainConfig, resume/fine-tune wiring, then the training run.
#include "cli/commands.h"
#include "cli/launch.h"
#include "core/error.h"
#include "core/json.h"
#include "runtime/runtime.h"
#include "train/config.h"
#include "train/resolve.h"
#include "train/trainer.h"
#include "train/workspace.h"

#include <CLI/CLI.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <optional>
#include <memory>

namespace convnets::cli {
namespace {

struct TrainArgs {
  std::string resume, fine_tune, key_layout = "auto";
  bool print_config = false;
  std::map<std::string, std::string> values;  // field -> text of the flag given
  std::string tensorboard_folder;             // the DIR of --tensorboard [DIR], if one was given
  // What the flags say beside `values` (DLE's, timm's and GPUNet's spellings among them), as train/resolve.h reads it.
  train::ConfigSources sources;
  distributed::LaunchOptions launch;
};

int run(TrainArgs& a) {
  train::RunOptions options;
  options.command = "convnets train";
  // Every rank decides alike (the same files); rank 0 says what it found.
  const char* rank = std::getenv("RANK");
  const bool speak = rank == nullptr || std::string(rank) == "0";
  const std::string workspace = a.values.count("workspace") ? a.values.at("workspace") : train::TrainConfig{}.workspace;
  options.torchrun_job = train::torchrun_job();
  auto choice = train::choose_resume(a.resume, workspace, a.key_layout, options.torchrun_job, train::job_restart());
  for (const auto& line : choice.said)
    if (speak) std::cout << line << '\n';
  options.resume = std::move(choice.checkpoint);
  options.take_over_left_log = choice.take_over_left_log;

  train::ConfigSources sources = a.sources;
  sources.resume = &options.resume;
  sources.resume_path = choice.path;
  for (const auto& [field, text] : a.values) sources.flags[field] = train::parse_field(field, text);
  auto resolved = train::resolve_config(sources);
  for (const auto& line : resolved.said) std::cout << line << '\n';
  for (const auto& note : resolved.notes) std::cerr << "convnets: note: " << note << "\n";
  const train::TrainConfig& config = resolved.config;
  options.evaluation_log = resolved.evaluation_log;
  options.optimizer_batch_given = resolved.optimizer_batch_given;
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
  cmd->add_option("DATA", args->sources.data, "training data (folder with train/ and val/, class folders, list file, IDX folder)");
  // A repeated flag overrides the earlier one, as with argparse in DLE's main.py.
  const auto last = CLI::MultiOptionPolicy::TakeLast;
  cmd->add_option("--recipe", args->sources.recipe,
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
  cmd->add_flag_callback("--amp", [args] { args->sources.flags["precision"] = "amp"; }, "DLE: --precision amp");
  cmd->add_option_function<std::int64_t>(
         "--gather-checkpoints",
         [args](std::int64_t n) {
           // DLE writes checkpoint_NNNN every epoch and keeps the last N (0: all;
           // -1: none survive). Bare, as older main.py took it: all.
           args->sources.flags["save_every"] = n < 0 ? 0 : 1;
           args->sources.flags["keep"] = n < 0 ? 0 : n;
         },
         "DLE: keep an epoch-N checkpoint of every epoch, the last N of them (0 or bare: all; -1: none)")
      ->expected(0, 1)
      ->default_str("0");
  // DLE's -c/--model-config (image_classification/models/resnet.py's resnet_configs): they differ only in the
  // convolutions' Kaiming mode; none zeroes the last BN of a block.
  cmd->add_option_function<std::string>(
         "-c,--model-config",
         [args](const std::string& config) {
           args->sources.flags["init"] = config == "classic" || config == "grp-fanout" ? "fan_out" : "fan_in";
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
         "--conv_init", [args](const std::string& mode) { args->sources.flags["init"] = mode; },
         "DLE: fan_in | fan_out, the convolutions' Kaiming mode: --init")
      ->check(CLI::IsMember({"fan_in", "fan_out"}));
  cmd->add_option_function<std::string>(
      "--last_bn_0_init",
      [args, truth](const std::string& v) { args->sources.flags["zero_init_residual"] = truth("--last_bn_0_init", v); },
      "DLE: True zeroes the last BN of each residual branch: --zero-init-residual");
  // DLE's launch.py (configs.yml): a mode block of fields under the flags given, and the platform's configuration.
  cmd->add_option_function<std::string>(
         "--mode",
         [args](const std::string& mode) {
           auto& m = args->sources.mode_defaults;
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
  cmd->add_option("--platform", args->sources.platform,
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
      "--dynamic-loss-scale", [args] { args->sources.dynamic_loss_scale = true; },
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
        if (s == "step") args->sources.flags["lr_schedule"] = "staircase";
        else if (s == "cosine") args->sources.flags["lr_schedule"] = "cosine";
        else throw Error("--sched " + s + ": convnets has timm's step (--lr-schedule staircase) and cosine schedules");
        // A timm command line leaves these at timm's train.py defaults, which
        // differ from convnets' (DLE's).
        args->sources.timm_defaults["warmup"] = 3;
        args->sources.timm_defaults["warmup_lr"] = 1e-4;
        args->sources.timm_defaults["train_interpolation"] = "random";
      },
      "timm: step (decay by --decay-rate every --decay-epochs) | cosine; where no recipe or flag sets them, also "
      "timm's defaults --warmup-epochs 3, --warmup-lr 1e-4 and --train-interpolation random");
  cmd->add_option_function<std::string>(
      "--opt",
      [args](const std::string& s) {
        // timm's create_optimizer: "sgd" and "nesterov" are Nesterov SGD, "momentum" plain momentum SGD.
        if (s == "rmsproptf" || s == "rmsprop") args->sources.flags["optimizer"] = s;
        else if (s == "sgd" || s == "nesterov") args->sources.flags["optimizer"] = "sgd", args->sources.flags["nesterov"] = true;
        else if (s == "momentum") args->sources.flags["optimizer"] = "sgd", args->sources.flags["nesterov"] = false;
        else throw Error("--opt " + s + ": convnets has timm's rmsproptf, rmsprop, sgd (Nesterov), nesterov and momentum");
      },
      "timm: rmsproptf | rmsprop (torch.optim.RMSprop) | sgd (Nesterov) | nesterov | momentum");
  cmd->add_option("--drop", args->sources.timm_drop, "timm: dropout before the classifier (ignored for GPUNets, as DLE's train.py)");
  cmd->add_option("--drop-connect", args->sources.timm_drop_connect,
                  "timm: drop-path rate (ignored for GPUNets, as DLE's train.py)");
  cmd->add_flag_callback(
      "--model-ema",
      [args] {
        // timm's ModelEmaV2: decay 0.9998 unless --model-ema-decay (or the recipe) says, no warm-up.
        args->sources.timm_defaults["ema"] = 0.9998;
        args->sources.flags["ema_warmup"] = false;
      },
      "timm: keep a weight EMA (decay --model-ema-decay or the recipe's, else 0.9998; no warm-up)");
  cmd->add_option_function<std::string>(
      "--enable-distill", [args, truth](const std::string& v) { args->sources.enable_distill = truth("--enable-distill", v); },
      "GPUNet: True distils from --teacher, False trains without a teacher whatever else names one");
  cmd->add_option_function<std::string>(
         "--test-teacher", [args, truth](const std::string& v) { args->sources.flags["test_teacher"] = truth("--test-teacher", v); },
         "GPUNet: validate the teacher before training: --test-teacher alone or True; False or absent: not")
      ->expected(0, 1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)
      ->default_str("True");
  cmd->add_option_function<std::string>(
         "--tensorboard",
         [args](const std::string& dir) {
           args->sources.flags["tensorboard"] = true;
           if (!dir.empty()) args->sources.flags["tensorboard_dir"] = args->tensorboard_folder = dir;
         },
         "also write TensorBoard event files: log.json's scalars, the config, the first batch's images; in DIR if "
         "given (default: WORKSPACE/tensorboard)")
      ->expected(0, 1)
      ->multi_option_policy(CLI::MultiOptionPolicy::TakeLast)  // the last flag wins, as for every other flag
      ->type_name("[DIR]");
  cmd->add_flag_callback("--no-tensorboard", [args] { args->sources.flags["tensorboard"] = false; }, "turn off --tensorboard");
  // The switches --fusion replaced, with their meaning: what scripts written before it still pass.
  cmd->add_flag_callback("--no-fused-bn", [args] { args->sources.flags["fusion"] = "none"; }, "--fusion none");
  cmd->add_flag_callback("--fused-bn", [args] { args->sources.flags["fusion"] = "bn"; }, "--fusion bn");
  cmd->add_flag_callback("--norm-conv", [args] { args->sources.flags["fusion"] = "normconv"; }, "--fusion normconv");
  cmd->add_flag_callback("--no-norm-conv", [args] { args->sources.flags["fusion"] = "bn"; }, "--fusion bn");
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
      cmd->add_flag_callback(flag, [args, field] { args->sources.flags[field] = true; }, help);
      cmd->add_flag_callback("--no-" + train::flag_for(field).substr(2), [args, field] { args->sources.flags[field] = false; },
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
