#include "train/trainer.h"

#include "core/error.h"
#include "data/dataset.h"
#include "distributed/grad_sync.h"
#include "distributed/group.h"
#include "data/loader.h"
#include "io/atomic_file.h"
#include "io/state_dict.h"
#include "models/registry.h"
#include "train/dllogger.h"
#include "train/ema.h"
#include "train/evaluate.h"
#include "train/graph_step.h"
#include "train/loss_scale.h"
#include "train/progress.h"
#include "train/runtime.h"
#include "train/schedule.h"
#include "train/optimizer.h"
#include "train/step.h"

#include <torch/torch.h>

#include <atomic>
#include <chrono>
#include <csignal>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <thread>

namespace convnets::train {
namespace fs = std::filesystem;

namespace {

std::atomic<int> g_signal{0};

extern "C" void on_signal(int sig) {
  g_signal.store(sig);
  // A second signal kills the process the default way.
  std::signal(sig, SIG_DFL);
}

// Installed for the run only, so a Ctrl-C during setup still exits at once.
class SignalScope {
 public:
  SignalScope() {
    g_signal.store(0);
    previous_int_ = std::signal(SIGINT, on_signal);
    previous_term_ = std::signal(SIGTERM, on_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, previous_int_);
    std::signal(SIGTERM, previous_term_);
  }

 private:
  void (*previous_int_)(int);
  void (*previous_term_)(int);
};

const char* signal_name(int sig) { return sig == SIGTERM ? "SIGTERM" : sig == SIGINT ? "SIGINT" : "a signal"; }

std::string fmt(const char* format, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, format, v);
  return buf;
}

// The classifier's module path ("fc.", "network. layer15.net.6."): every
// arch registers its Linear classifier last.
std::string classifier_prefix(const NetworkImpl& model) {
  const auto params = model.named_parameters();
  const auto& last = params.keys().back();
  return last.substr(0, last.rfind('.') + 1);
}

// --fine-tune: every tensor must fit except the classifier, which is kept
// freshly initialised when its shape differs (another class count).
void load_fine_tune(NetworkImpl& model, const std::string& path, const ArchInfo& arch) {
  const auto ckpt = load_checkpoint(path);
  if (ckpt.is_training_checkpoint() && !same_architecture(arch, ckpt.meta)) {
    throw Error("--fine-tune " + path + " holds a " + ckpt.meta.value("arch", "?") + ", this run trains " + arch.name);
  }
  auto report = load_state_dict(model, ckpt.section("model."), path, arch.import_key, /*strict=*/false);
  std::vector<std::string> problems;
  std::vector<std::string> reinitialised;
  const auto classifier = classifier_prefix(model);
  for (const auto& m : report.mismatched) {
    (m.name.rfind(classifier, 0) == 0 ? reinitialised : problems).push_back(m.name);
  }
  for (const auto& m : report.missing) problems.push_back("missing " + m);
  for (const auto& u : report.unexpected) problems.push_back("unexpected " + u);
  if (!problems.empty()) {
    throw Error("--fine-tune " + path + " does not fit " + arch.name + ": " + join(problems),
                report.describe());
  }
  std::cout << "fine-tune: weights from " << path
            << (reinitialised.empty() ? "" : "; new classifier (" + join(reinitialised) + ")") << '\n';
}

// The frozen teacher of knowledge distillation: its arch, the model weights
// of a convnets checkpoint (or a plain weights file), eval mode, no gradients.
Network load_teacher(const TrainConfig& c, std::int64_t num_classes, const Runtime& rt) {
  const auto ckpt = load_checkpoint(c.teacher_checkpoint);
  const ArchInfo& tarch = find_architecture(c.teacher);
  if (ckpt.is_training_checkpoint()) {
    if (!same_architecture(tarch, ckpt.meta)) {
      throw Error("--teacher-checkpoint " + c.teacher_checkpoint + " holds a " + ckpt.meta.value("arch", "?") +
                  ", not the --teacher " + c.teacher);
    }
    const auto classes = ckpt.meta.value("num_classes", std::int64_t{0});
    if (classes != num_classes) {
      throw Error("--teacher-checkpoint " + c.teacher_checkpoint + " predicts " + std::to_string(classes) +
                  " classes, the training data has " + std::to_string(num_classes));
    }
  }
  ModelOptions to;
  to.num_classes = num_classes;
  auto teacher = build_model(tarch, to);
  load_weights(*teacher, ckpt, "model.", tarch.import_key);
  prepare_model(*teacher, rt);
  teacher->eval();
  for (auto& p : teacher->parameters()) p.set_requires_grad(false);
  return teacher;
}

void check_same_classes(const data::Dataset& train, const data::Dataset& val) {
  if (train.classes() != val.classes()) {
    throw Error("validation data has " + std::to_string(val.num_classes()) + " classes (" + val.description() +
                    "), training data " + std::to_string(train.num_classes()) + "; the class names must match",
                "pass --val-data with the same class folders, or --training-only");
  }
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

}  // namespace

std::string last_checkpoint_path(const std::string& workspace) {
  return (fs::path(workspace) / "last.safetensors").string();
}

namespace {

int train_impl(const TrainConfig& config, const RunOptions& options, std::unique_ptr<distributed::Group>& group) {
  using clock = std::chrono::steady_clock;
  validate(config);
  const auto& c = config;
  const distributed::WorkerEnv* denv = options.dist && options.dist->world_size > 1 ? &*options.dist : nullptr;
  const Runtime rt = resolve_runtime(c.device, c.precision, c.memory_format, denv ? denv->local_rank : 0);
  distributed::resolve_backend(c.dist_backend, rt.device);  // a --dist-backend this machine cannot run fails every run
  // Connect first: a rank that fails later (bad data, an occupied workspace)
  // then reaches the others as a named failure instead of a rendezvous timeout.
  if (denv) group = std::make_unique<distributed::Group>(*denv, rt.device, c.dist_backend);
  const int world = group ? group->world_size() : 1;
  const int rank = group ? group->rank() : 0;
  const bool writer = rank == 0;  // checkpoints, logs, reports and progress
  const ArchInfo& arch = find_architecture(c.arch);
  const Preprocessing pre = resolve_preprocessing(arch, c);

  // ---- data (bad paths and empty class sets fail here, before any write)
  auto train_ds = data::head(data::open_dataset(c.data, "train"), static_cast<std::size_t>(c.max_train_images));
  data::DatasetPtr val_ds;
  if (!c.training_only) {
    val_ds = data::head(data::open_dataset(c.val_data.empty() ? c.data : c.val_data, "val"),
                        static_cast<std::size_t>(c.max_val_images));
    check_same_classes(*train_ds, *val_ds);
  }
  // DLE's semantics: --optimizer-batch-size counts every process's images.
  const std::int64_t per_round = c.batch_size * world;
  if (c.optimizer_batch_size > 0 && c.optimizer_batch_size % per_round != 0) {
    throw Error("--optimizer-batch-size " + std::to_string(c.optimizer_batch_size) + " is not a multiple of --batch-size " +
                    std::to_string(c.batch_size) + " x " + std::to_string(world) + " processes",
                "the optimizer batch counts all processes' images; use a multiple of " + std::to_string(per_round));
  }
  const std::int64_t micro_per_step = c.optimizer_batch_size > 0 ? c.optimizer_batch_size / per_round : 1;
  const std::int64_t optimizer_batch = per_round * micro_per_step;

  // ---- model, optimizer, EMA, loss scale
  torch::manual_seed(static_cast<std::uint64_t>(c.seed));
  ModelOptions mo;
  mo.num_classes = static_cast<std::int64_t>(train_ds->num_classes());
  mo.conv_init = c.init == "fan_out" ? ConvInit::FanOut : ConvInit::FanIn;
  mo.zero_init_residual = c.zero_init_residual;
  mo.dropout = c.dropout;
  mo.drop_path = c.drop_path;
  Network model = build_model(arch, mo);
  const Checkpoint* resume = options.resume ? &*options.resume : nullptr;
  if (resume) {
    const auto& m = resume->meta;
    if (!same_architecture(arch, m)) {
      throw Error("--resume " + resume->path + " was trained as " + m.at("arch").get<std::string>() +
                      (m.contains("arch_definition") ? " (its layer list is in the checkpoint)" : "") +
                      ", but this run is " + arch.name,
                  "resume with the same --arch (and the same layer list), or use --fine-tune to start anew");
    }
    const auto trained_with = m.at("config").value("optimizer", std::string("sgd"));
    if (trained_with != c.optimizer) {
      throw Error("--resume " + resume->path + " was trained with --optimizer " + trained_with + ", this run uses " +
                      c.optimizer,
                  "resume with the same --optimizer, or use --fine-tune to start a new optimizer from its weights");
    }
    if (m.at("num_classes").get<std::int64_t>() != mo.num_classes) {
      throw Error("--resume " + resume->path + " has " + std::to_string(m.at("num_classes").get<std::int64_t>()) +
                  " classes, the data " + std::to_string(mo.num_classes));
    }
    load_weights(*model, *resume, "model.", arch.import_key);
  } else if (!options.fine_tune.empty()) {
    load_fine_tune(*model, options.fine_tune, arch);
  } else if (c.evaluate) {
    throw Error("--evaluate needs weights", "add --resume CHECKPOINT or --fine-tune WEIGHTS (or use convnets eval)");
  }
  prepare_model(*model, rt);
  if (group && c.sync_bn) {
    // The group outlives the model's use of it: both end with this function.
    layers::enable_sync_batchnorm(*model, std::shared_ptr<layers::BatchNormSync>(group.get(), [](auto*) {}));
  }
  OptimizerOptions oo;
  oo.kind = c.optimizer;
  oo.momentum = c.momentum;
  oo.nesterov = c.nesterov;
  oo.weight_decay = c.weight_decay;
  oo.decay_all = c.bn_weight_decay;
  oo.alpha = c.rmsprop_alpha;
  oo.eps = c.opt_eps;
  const auto optimizer = make_optimizer(*model, oo);
  std::unique_ptr<distributed::GradientReducer> reducer;
  if (group) {
    reducer = std::make_unique<distributed::GradientReducer>(*group, optimizer->flat(), c.bucket_mb,
                                                      /*broadcast_buffers=*/!c.sync_bn);
    reducer->broadcast_state(*model);  // ranks start bit-identical whatever they loaded
  }
  std::unique_ptr<LossScaler> scaler;
  if (rt.loss_scaling) scaler = std::make_unique<LossScaler>(rt.device);
  Network teacher = c.teacher.empty() ? nullptr : load_teacher(c, mo.num_classes, rt);
  std::unique_ptr<Ema> ema;
  if (c.ema > 0) {
    auto shadow = build_model(arch, mo);
    prepare_model(*shadow, rt);
    ema = std::make_unique<Ema>(shadow, *model, c.ema);
  }
  std::int64_t start_epoch = 0, start_step_in_epoch = 0, global_step = 0;
  double best_top1 = -1;
  std::int64_t best_epoch = -1;
  if (resume) {
    const auto& m = resume->meta;
    optimizer->load_state(resume->file, resume->path);
    if (scaler) {
      // Switching to amp on resume starts a fresh scale; the reverse drops it.
      if (resume->file.find("loss_scale.scale")) scaler->load_state(resume->file, resume->path);
    }
    if (ema) {
      if (resume->section("ema.").tensors.empty()) {
        std::cout << "resume: " << resume->path << " has no EMA; the EMA starts from the current weights\n";
      } else {
        load_weights(*ema->model(), *resume, "ema.", arch.import_key);
      }
    }
    start_epoch = m.at("epoch").get<std::int64_t>();
    start_step_in_epoch = m.value("step_in_epoch", std::int64_t{0});
    global_step = m.at("step").get<std::int64_t>();
    best_top1 = m.value("best_top1", -1.0);
    best_epoch = m.value("best_epoch", std::int64_t{-1});
  }

  // ---- loaders
  // With a teacher at another resolution, images load at the teacher's and
  // the student gets them resized (DLE's GPUNet train.py, useTwoRes).
  const int load_size = c.teacher_img_size > 0 ? static_cast<int>(c.teacher_img_size) : pre.input_size;
  data::TransformOptions train_t = data::TransformOptions::train(load_size);
  train_t.crop.scale_min = c.crop_scale_min;
  train_t.flip = c.flip;
  data::LoaderOptions lo;
  lo.batch_size = c.batch_size;
  lo.workers = static_cast<int>(c.workers);
  if (lo.workers == 0 && denv && denv->local_world_size > 1) {
    lo.workers = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / denv->local_world_size);
  }
  lo.shard.rank = rank;
  lo.shard.world_size = world;
  lo.drop_last = true;
  lo.shard.shuffle = true;
  lo.shard.seed = static_cast<std::uint64_t>(c.seed);
  lo.bad_images = data::parse_bad_image_policy(c.bad_images);
  std::unique_ptr<data::Loader> train_loader;
  if (!c.evaluate) {
    data::LoaderOptions tlo = lo;
    tlo.shard.block = c.batch_size;  // whole micro-batches per rank: see ShardOptions::block
    tlo.shard.drop_tail = true;
    tlo.device_decode = use_device_decode(c.data_backend, rt);
    train_loader = std::make_unique<data::Loader>(train_ds, std::make_shared<data::Transform>(train_t), tlo);
  }
  std::unique_ptr<data::Loader> val_loader;
  if (val_ds) val_loader = make_eval_loader(val_ds, pre, lo);

  std::function<void(at::Tensor&)> sum_over_ranks;
  if (group) sum_over_ranks = [&](at::Tensor& t) { group->all_reduce_sum(t); };
  auto validate_models = [&](std::int64_t epoch, nlohmann::ordered_json& data) -> EvalResult {
    const std::string tag = "epoch " + std::to_string(epoch + 1) + "/" + std::to_string(c.epochs);
    auto r = evaluate(*model, *val_loader, rt, pre, c.top_k, writer ? tag + " val" : "", c.print_freq, sum_over_ranks);
    data.update(r.to_dllogger("val"));
    if (ema) {
      auto e = evaluate(*ema->model(), *val_loader, rt, pre, c.top_k, writer ? tag + " val (EMA)" : "", c.print_freq,
                        sum_over_ranks);
      data.update(e.to_dllogger("val_ema"));
    }
    return r;
  };

  if (c.evaluate) {
    nlohmann::ordered_json data;
    validate_models(start_epoch > 0 ? start_epoch - 1 : 0, data);
    if (writer) std::cout << data.dump(2) << '\n';
    return 0;
  }

  const std::int64_t steps_per_epoch = train_loader->batches_per_epoch() / micro_per_step;
  if (steps_per_epoch < 1) {
    throw Error("an epoch of " + std::to_string(train_loader->samples_per_epoch()) +
                " images is smaller than one optimizer batch of " + std::to_string(optimizer_batch),
                "lower --batch-size or --optimizer-batch-size");
  }
  ScheduleOptions so;
  so.kind = c.lr_schedule;
  so.base_lr = scaled_lr(c.lr, optimizer_batch, c.lr_reference_batch);
  so.warmup_epochs = c.warmup;
  so.steps = c.lr_steps;
  so.step_factor = c.lr_step_factor;
  so.end_lr = c.end_lr;
  so.warmup_lr = c.warmup_lr;
  so.decay_epochs = c.lr_decay_epochs;
  so.steps_per_epoch = steps_per_epoch;
  so.epochs = c.epochs;
  const LrSchedule schedule(so);
  if (resume) {
    // A different world size (or batch, or accumulation) changes the images
    // per step; the checkpoint's position is converted through the images
    // consumed, which the batch-dealing sampler orders the same for any split.
    const auto& m = resume->meta;
    const auto& old = m.at("config");
    const std::int64_t old_batch = old.value("batch_size", std::int64_t{0});
    const std::int64_t old_obs = old.value("optimizer_batch_size", std::int64_t{0});
    const std::int64_t old_world = m.value("world_size", std::int64_t{1});
    const std::int64_t old_step_images =
        m.value("images_per_step", old_obs > 0 ? old_obs : old_batch * old_world);
    if (old_step_images != optimizer_batch) {
      const std::int64_t consumed = start_step_in_epoch * old_step_images;
      if (consumed % optimizer_batch != 0) {
        throw Error("--resume " + resume->path + " stopped " + std::to_string(consumed) + " images into epoch " +
                        std::to_string(start_epoch + 1) + ", not a whole number of this run's steps of " +
                        std::to_string(optimizer_batch) + " images",
                    "resume with a step size (--batch-size x processes x micro-batches) that divides it, or from an "
                    "epoch-end checkpoint");
      }
      start_step_in_epoch = consumed / optimizer_batch;
      global_step = start_epoch * steps_per_epoch + start_step_in_epoch;
      if (writer) {
        std::cout << "resume: " << old_world << " process(es) x " << old_step_images / old_world << " -> " << world
                  << " x " << optimizer_batch / world << " images per step; continuing at image " << consumed
                  << " of epoch " << start_epoch + 1 << '\n';
      }
    }
  }
  if (start_step_in_epoch >= steps_per_epoch) {
    throw Error("--resume " + resume->path + " stopped at step " + std::to_string(start_step_in_epoch) +
                " of an epoch that now has " + std::to_string(steps_per_epoch) + " steps",
                "resume with the same data, --batch-size and --optimizer-batch-size");
  }

  // ---- workspace: refuse to overwrite another run; everything above was checked first
  const std::string last_path = last_checkpoint_path(c.workspace);
  if (writer) {
    if (!resume && fs::exists(last_path)) {
      throw Error("--workspace " + c.workspace + " already holds a run (" + last_path + ")",
                  "continue it with --resume " + last_path + ", or pick another --workspace");
    }
    fs::create_directories(c.workspace);
  }
  const auto resolved = to_json(c);
  const nlohmann::ordered_json derived{{"optimizer_batch", optimizer_batch},
                                       {"micro_batches_per_step", micro_per_step},
                                       {"world_size", world},
                                       {"sync_bn", c.sync_bn && world > 1},
                                       {"base_lr_scaled", so.base_lr},
                                       {"steps_per_epoch", steps_per_epoch},
                                       {"warmup_steps", schedule.warmup_steps()},
                                       {"num_classes", mo.num_classes},
                                       {"preprocessing", to_json(pre)},
                                       {"device", rt.device.str()},
                                       {"train_data", train_ds->description()},
                                       {"val_data", val_ds ? val_ds->description() : ""}};
  std::unique_ptr<DlLogger> log;
  if (writer) {
    write_file_atomically((fs::path(c.workspace) / "config.json").string(),
                          nlohmann::ordered_json{{"config", resolved}, {"derived", derived}}.dump(2) + "\n");
    log = std::make_unique<DlLogger>((fs::path(c.workspace) / "log.json").string(), /*append=*/resume != nullptr);
  }
  if (log) {
    auto& log_ref = *log;
    nlohmann::ordered_json params = resolved;
    params.update(derived);
    params["resumed_from"] = resume ? resume->path : "";
    log_ref.log("PARAMETER", params);
    for (const char* m : {"train.loss", "val.loss"}) log_ref.metadata(m, {{"unit", ""}, {"format", ":>.5f"}});
    for (const char* m : {"train.total_ips", "train.compute_ips", "val.total_ips", "val.compute_ips"}) {
      log_ref.metadata(m, {{"unit", "images/s"}, {"format", ":>.2f"}});
    }
    for (const char* m : {"val.top1", "val.top5"}) log_ref.metadata(m, {{"unit", "%"}, {"format", ":>.2f"}});
  }

  std::vector<std::string> class_names = train_ds->classes();
  auto checkpoint_meta = [&](std::int64_t epoch, std::int64_t step_in_epoch) {
    nlohmann::json m;
    m["format"] = kCheckpointFormat;
    m.update(architecture_meta(arch));
    m["num_classes"] = mo.num_classes;
    m["class_names"] = class_names;
    m["preprocessing"] = to_json(pre);
    m["config"] = resolved;
    m["epoch"] = epoch;
    m["step_in_epoch"] = step_in_epoch;
    m["step"] = global_step;
    m["best_top1"] = best_top1;
    m["best_epoch"] = best_epoch;
    m["seed"] = c.seed;
    // Augmentation, data order and mixup draw from counter-based streams of
    // (seed, epoch, index) and (seed, step): the position is the RNG state.
    m["rng"] = "splitmix64(seed, epoch, sample) for data; splitmix64(seed, step, micro-batch) for mixup";
    m["loss_scale"] = scaler ? scaler->value() : 1.0;
    m["world_size"] = world;
    m["images_per_step"] = optimizer_batch;
    return m;
  };
  auto save = [&](const std::string& path, std::int64_t epoch, std::int64_t step_in_epoch) {
    if (!writer) return;  // every rank holds the same state; rank 0 writes it
    NamedTensors tensors;
    for (auto& [k, t] : state_dict(*model)) tensors.emplace_back("model." + k, t);
    if (ema) {
      for (auto& [k, t] : state_dict(*ema->model())) tensors.emplace_back("ema." + k, t);
    }
    for (auto& e : optimizer->state()) tensors.push_back(e);
    if (scaler) {
      for (auto& e : scaler->state()) tensors.push_back(e);
    }
    tensors.emplace_back("rng.torch_cpu", at::detail::getDefaultCPUGenerator().get_state());
    save_checkpoint(path, tensors, checkpoint_meta(epoch, step_in_epoch));
  };

  if (writer) {
    std::cout << "train: " << arch.name << ", " << train_ds->description() << '\n'
              << "       " << steps_per_epoch << " steps/epoch of " << optimizer_batch << " images"
              << (world > 1 ? " (" + std::to_string(world) + " processes x " + std::to_string(c.batch_size) + ")" : "")
              << (micro_per_step > 1 ? " (" + std::to_string(micro_per_step) + " micro-batches)" : "")
              << ", lr " << so.base_lr << " " << c.lr_schedule << ", " << rt.device.str() << " " << c.precision << ", "
              << train_loader->workers() << " loader threads\n";
    if (teacher) {
      std::cout << "       distillation: teacher " << c.teacher << " from " << c.teacher_checkpoint << " at "
                << load_size << " px, student at " << pre.input_size << " px\n";
    }
    if (group) {
      std::cout << "       data-parallel: " << world << " ranks over " << group->backend() << " ("
                << denv->source << ", store " << denv->master_addr << ":" << denv->master_port << "), "
                << reducer->stats().buckets << " gradient buckets of <= " << c.bucket_mb << " MiB"
                << (c.sync_bn ? ", synchronized BN" : "") << '\n';
    }
  }
  if (resume && writer) {
    std::cout << "resume: " << resume->path << " at epoch " << start_epoch + 1 << ", step " << start_step_in_epoch
              << "/" << steps_per_epoch << '\n';
  }

  // `last` is saved by then; the exit code and message say how to go on.
  auto interrupted = [&](int sig, const std::string& where) {
    if (!writer) return 128 + sig;
    std::cerr << "convnets: interrupted by " << signal_name(sig) << " " << where << "; saved " << last_path
              << "\n  resume with: " << options.command << " --resume " << last_path << '\n';
    return 128 + sig;
  };
  SignalScope signals;
  StepOptions step_options{c.label_smoothing, c.mixup, static_cast<std::uint64_t>(c.seed), rt.autocast, reducer.get()};
  step_options.teacher = teacher.get();
  step_options.student_size = pre.input_size;
  step_options.random_layers = model->random_in_training();
  StepRunner stepper(*model, *optimizer, scaler.get(), ema.get(), step_options, rt.device, c.cuda_graph);
  const bool terminal = writer && Progress::stdout_is_terminal();
  // A signal must stop every rank after the same step, or the collectives
  // would go out of step: data-parallel runs agree on it at each log line.
  auto stop_signal = [&](bool check_point) -> int {
    const int sig = g_signal.load();
    if (!group) return sig;
    if (!check_point) return 0;
    return group->any(sig != 0) ? (sig != 0 ? sig : SIGTERM) : 0;
  };
  const std::int64_t total_steps = c.prof > 0 ? std::min(c.prof, schedule.total_steps()) : schedule.total_steps();
  bool stopped_by_prof = false;
  data::Batch batch;
  EvalResult last_val;

  for (std::int64_t epoch = start_epoch; epoch < c.epochs && !stopped_by_prof; ++epoch) {
    const std::int64_t first = epoch == start_epoch ? start_step_in_epoch : 0;
    train_loader->start_epoch(epoch, first * micro_per_step);
    Progress progress("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(c.epochs) + " train",
                      steps_per_epoch, c.print_freq, terminal, first);
    auto epoch_loss = torch::zeros({}, torch::dtype(torch::kDouble).device(rt.device));
    auto window_loss = torch::zeros_like(epoch_loss);
    double data_s = 0, compute_s = 0, window_data_s = 0, window_compute_s = 0;
    std::int64_t window_steps = 0, epoch_steps = 0;
    double lr = 0;
    const auto epoch_start = clock::now();
    for (std::int64_t s = first; s < steps_per_epoch; ++s) {
      const auto t0 = clock::now();
      std::vector<MicroBatch> micro;
      for (std::int64_t m = 0; m < micro_per_step; ++m) {
        if (!train_loader->next(batch)) throw Error("loader: the epoch ended early");  // not reachable: sizes checked
        micro.push_back({batch_input(batch, pre, rt), batch.labels.to(rt.device, /*non_blocking=*/true)});
      }
      const auto t1 = clock::now();
      lr = schedule.at(global_step);
      const at::Tensor step_loss = stepper.run(micro, lr, global_step);
      ++global_step;
      if (group) group->set_progress(global_step);
      epoch_loss += step_loss;
      window_loss += step_loss;
      const auto t2 = clock::now();
      const double d = std::chrono::duration<double>(t1 - t0).count();
      const double k = std::chrono::duration<double>(t2 - t1).count();
      data_s += d;
      compute_s += k;
      window_data_s += d;
      window_compute_s += k;
      ++window_steps;
      ++epoch_steps;
      const bool log_now = (s + 1) % c.print_freq == 0 || s + 1 == steps_per_epoch;
      if (log_now) {
        if (group) {
          group->all_reduce_sum(window_loss);
          window_loss /= world;
        }
        const double wl = window_loss.item<double>() / static_cast<double>(window_steps);
        const double images = static_cast<double>(window_steps * optimizer_batch);
        nlohmann::ordered_json d_json{{"train.loss", wl},
                                      {"train.total_ips", images / (window_data_s + window_compute_s)},
                                      {"train.compute_ips", images / window_compute_s},
                                      {"train.data_time", window_data_s / static_cast<double>(window_steps)},
                                      {"train.compute_time", window_compute_s / static_cast<double>(window_steps)},
                                      {"train.lr", lr}};
        if (scaler) d_json["train.loss_scale"] = scaler->value();
        if (log) log->log({epoch + 1, s + 1}, d_json);
        window_loss.zero_();
        window_data_s = window_compute_s = 0;
        window_steps = 0;
        if (writer) {
          progress.update(s + 1, d_json["train.total_ips"].get<double>(), "loss " + fmt("%.4f", wl) +
                                                                             "  lr " + fmt("%.4g", lr));
        }
      } else if (terminal) {
        const double el = std::chrono::duration<double>(clock::now() - epoch_start).count();
        progress.update(s + 1, static_cast<double>(epoch_steps * optimizer_batch) / el, "lr " + fmt("%.4g", lr));
      }
      const int sig = stop_signal(log_now);
      if (sig != 0 && s + 1 < steps_per_epoch) {
        save(last_path, epoch, s + 1);
        std::cout << '\n';
        return interrupted(sig, "at epoch " + std::to_string(epoch + 1) + ", step " + std::to_string(s + 1) + "/" +
                                    std::to_string(steps_per_epoch));
      }
      if (c.prof > 0 && global_step >= total_steps) {
        stopped_by_prof = true;
        break;
      }
    }
    const double epoch_s = std::chrono::duration<double>(clock::now() - epoch_start).count();
    const double n_images = static_cast<double>(epoch_steps * optimizer_batch);
    if (group) {
      group->all_reduce_sum(epoch_loss);
      epoch_loss /= world;
    }
    const double mean_loss = epoch_loss.item<double>() / static_cast<double>(std::max<std::int64_t>(epoch_steps, 1));
    if (writer) progress.finish("loss " + fmt("%.4f", mean_loss) + "  " + fmt("%.0f", n_images / epoch_s) + " img/s");
    nlohmann::ordered_json epoch_data{{"train.loss", mean_loss},
                                      {"train.total_ips", n_images / epoch_s},
                                      {"train.compute_ips", n_images / compute_s},
                                      {"train.data_time", data_s / static_cast<double>(epoch_steps)},
                                      {"train.compute_time", compute_s / static_cast<double>(epoch_steps)},
                                      {"train.lr", lr},
                                      {"train.bad_images", train_loader->stats().bad_images}};
    if (scaler) epoch_data["train.loss_scale"] = scaler->value();
    const bool epoch_complete = first + epoch_steps == steps_per_epoch;
    bool improved = false;
    if (val_loader) {
      last_val = validate_models(epoch, epoch_data);
      if (last_val.top1 > best_top1) {
        best_top1 = last_val.top1;
        best_epoch = epoch + 1;
        improved = true;
      }
    }
    if (log) log->log({epoch + 1}, epoch_data);
    const std::int64_t next_epoch = epoch_complete ? epoch + 1 : epoch;
    save(last_path, next_epoch, epoch_complete ? 0 : first + epoch_steps);
    if (improved && epoch_complete && writer) {
      copy_file_atomically(last_path, (fs::path(c.workspace) / "best.safetensors").string());
    }
    if (writer && epoch_complete && c.save_every > 0 && (epoch + 1) % c.save_every == 0) {
      copy_file_atomically(last_path,
                           (fs::path(c.workspace) / ("epoch-" + std::to_string(epoch + 1) + ".safetensors")).string());
      prune_epoch_checkpoints(c.workspace, c.keep);
    }
    const int sig = stop_signal(true);
    if (sig != 0 && epoch + 1 < c.epochs) {
      return interrupted(sig, "after epoch " + std::to_string(epoch + 1));
    }
  }
  nlohmann::ordered_json summary{{"train.steps", global_step}};
  if (best_epoch > 0) {
    summary["val.best_top1"] = best_top1;
    summary["val.best_epoch"] = best_epoch;
    summary.update(last_val.to_dllogger("val"));
  }
  if (!writer) return 0;
  log->log(nlohmann::json::array(), summary);
  std::cout << "done: " << global_step << " steps";
  if (best_epoch > 0) std::cout << ", best top-1 " << fmt("%.2f", best_top1) << "% (epoch " << best_epoch << ")";
  std::cout << "; checkpoints in " << c.workspace << '\n';
  return 0;
}

}  // namespace

int run_training(const TrainConfig& config, const RunOptions& options) {
  std::unique_ptr<distributed::Group> group;
  try {
    return train_impl(config, options, group);
  } catch (const distributed::DistributedError&) {
    throw;  // already the diagnosis; the failed rank published its own
  } catch (const std::exception& e) {
    // The other ranks name this one and its reason instead of a lost connection.
    if (group) group->publish_failure(e.what());
    throw;
  }
}

}  // namespace convnets::train
