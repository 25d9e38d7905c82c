#include "train/run.h"

#include "core/error.h"
#include "core/json.h"
#include "data/dataset.h"
#include "models/fusion.h"
#include "quant/eager.h"
#include "runtime/evaluate.h"
#include "runtime/fusion_setup.h"
#include "train/asp.h"
#include "train/world_change.h"

#include <torch/torch.h>

#include <iostream>
#include <thread>

namespace convnets::train {
using runtime::Checkpoint;
using runtime::Runtime;
using runtime::load_checkpoint;
using runtime::load_weights;
using runtime::make_eval_loader;
using runtime::prepare_model;
using runtime::resolve_runtime;
using runtime::use_device_decode;

namespace {

// The arch's preprocessing with the config's overrides (image size, crop ratio, mean, std).
Preprocessing resolve_preprocessing(const ArchInfo& arch, const TrainConfig& c) {
  Preprocessing p = arch.preprocessing;
  if (c.image_size > 0) p.input_size = static_cast<int>(c.image_size);
  if (c.crop_ratio > 0) p.crop_ratio = c.crop_ratio;
  if (!c.interpolation.empty()) p.interpolation = c.interpolation;
  if (!c.mean.empty()) p.mean = {c.mean[0], c.mean[1], c.mean[2]};
  if (!c.std.empty()) p.std = {c.std[0], c.std[1], c.std[2]};
  return p;
}

// The classifier's module path ("fc.", "network. layer15.net.6."): every
// arch registers its Linear classifier last.
std::string classifier_prefix(const NetworkImpl& model) {
  // keys() returns a vector by value: keep it, not a reference into the temporary.
  const auto keys = model.named_parameters().keys();
  const auto& last = keys.back();
  return last.substr(0, last.rfind('.') + 1);
}

// --fine-tune: every tensor must fit except the classifier, which is kept
// freshly initialised when its shape differs (another class count).
void load_fine_tune(NetworkImpl& model, const std::string& path, const ArchInfo& arch, const std::string& key_layout) {
  const auto ckpt = load_checkpoint(path, key_layout);
  if (ckpt.is_training_checkpoint() && !same_architecture(arch, ckpt.meta)) {
    throw Error("--fine-tune " + path + " holds a " + ckpt.meta.value("arch", "?") + ", this run trains " + arch.name);
  }
  auto report = load_fitting_weights(model, ckpt, "model.", arch);
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
// of a convnets checkpoint (or a plain weights file), eval mode, no gradients;
// `pre` gets the preprocessing it was trained with (a plain file: its arch's).
Network load_teacher(const TrainConfig& c, std::int64_t num_classes, const Runtime& rt, Preprocessing& pre) {
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
  pre = ckpt.is_training_checkpoint() ? preprocessing_from_json(ckpt.meta.at("preprocessing")) : tarch.preprocessing;
  ModelOptions to;
  to.num_classes = num_classes;
  auto teacher = build_model(tarch, to);
  load_weights(*teacher, ckpt, "model.", tarch);
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

// The datasets (bad paths and empty class sets fail here) and the step size.
void open_data(TrainingRun& run) {
  const auto& c = run.config;
  run.train_data = data::head(data::open_dataset(c.data, "train"), static_cast<std::size_t>(c.max_train_images));
  if (c.holdout > 0) {
    auto [rest, held] = data::holdout(run.train_data, static_cast<std::size_t>(c.holdout));
    run.train_data = std::move(rest);
    run.val_data = data::head(std::move(held), static_cast<std::size_t>(c.max_val_images));
  } else if (!c.training_only) {
    run.val_data = data::head(data::open_dataset(c.val_data.empty() ? c.data : c.val_data, "val"),
                              static_cast<std::size_t>(c.max_val_images));
    check_same_classes(*run.train_data, *run.val_data);
  }
  if (c.evaluate && c.prof > 0 && run.val_data) {
    // DLE's --evaluate --prof N: N validation batches on each process.
    run.val_data = data::head(std::move(run.val_data), static_cast<std::size_t>(c.prof * c.batch_size * run.world));
  }
  run.num_classes = static_cast<std::int64_t>(run.train_data->num_classes());
  if (c.num_classes > 0 && c.num_classes != run.num_classes) {
    throw Error("--num-classes " + std::to_string(c.num_classes) + ", but the training data has " +
                    std::to_string(run.num_classes) + " classes (" + run.train_data->description() + ")",
                "pass --num-classes " + std::to_string(run.num_classes) + " or leave it out");
  }
  const std::int64_t per_round = c.batch_size * run.world;
  if (c.optimizer_batch_size > 0 && c.optimizer_batch_size % per_round != 0) {
    throw Error("--optimizer-batch-size " + std::to_string(c.optimizer_batch_size) + " is not a multiple of --batch-size " +
                    std::to_string(c.batch_size) + " x " + std::to_string(run.world) + " processes",
                "the optimizer batch counts all processes' images; use a multiple of " + std::to_string(per_round));
  }
  run.micro_per_step = c.optimizer_batch_size > 0 ? c.optimizer_batch_size / per_round : 1;
  run.optimizer_batch = per_round * run.micro_per_step;
}

ModelOptions model_options(const TrainingRun& run) {
  const auto& c = run.config;
  ModelOptions mo;
  mo.num_classes = run.num_classes;
  mo.conv_init = c.init == "fan_out" ? ConvInit::FanOut : ConvInit::FanIn;
  mo.zero_init_residual = c.zero_init_residual;
  mo.dropout = c.dropout;
  mo.drop_path = c.drop_path;
  return mo;
}

// A checkpoint can only continue the run it came from.
void check_resumable(const TrainingRun& run) {
  const auto& m = run.resume->meta;
  const auto& path = run.resume->path;
  if (!same_architecture(run.arch, m)) {
    throw Error("--resume " + path + " was trained as " + m.at("arch").get<std::string>() +
                    (m.contains("arch_definition") ? " (its layer list is in the checkpoint)" : "") +
                    ", but this run is " + run.arch.name,
                "resume with the same --arch (and the same layer list), or use --fine-tune to start anew");
  }
  const auto trained_with = m.at("config").value("optimizer", std::string("sgd"));
  if (trained_with != run.config.optimizer) {
    throw Error("--resume " + path + " was trained with --optimizer " + trained_with + ", this run uses " +
                    run.config.optimizer,
                "resume with the same --optimizer, or use --fine-tune to start a new optimizer from its weights");
  }
  if (m.at("num_classes").get<std::int64_t>() != run.num_classes) {
    throw Error("--resume " + path + " has " + std::to_string(m.at("num_classes").get<std::int64_t>()) +
                " classes, the data " + std::to_string(run.num_classes));
  }
  if (!run.config.asp) {
    for (const auto& t : run.resume->file.tensors) {
      if (t.first.rfind("asp_mask.", 0) != 0) continue;
      throw Error("--resume " + path + " is a 2:4-sparse run (--asp); without --asp its pruned weights would grow back",
                  "resume it with --asp, or train its weights dense with --fine-tune " + path);
    }
  }
}

// --qat: the network behind fake quantization, with the ranges of the QAT run
// being resumed or calibrated now on training images (eval transform; the
// same images on every rank, so every rank gets the same ranges).
void start_qat(TrainingRun& run) {
  const auto& c = run.config;
  if (run.resume) {
    if (!run.resume->meta.contains("quantization")) {
      throw Error("--qat --resume " + run.resume->path + ": that run was not quantization-aware",
                  "start QAT from its weights with --fine-tune " + run.resume->path);
    }
    run.quant = std::make_shared<quant::Plan>(quant::plan_from_json(run.resume->meta.at("quantization"), run.resume->path));
    // The run goes on with the placement it trained; a flag asking for
    // another would be recorded in the config and silently not applied.
    if (quant::parse_activations(c.int8_activations, "--int8-activations") != run.quant->activations ||
        quant::parse_silu(c.int8_silu, "--int8-silu") != run.quant->silu) {
      throw Error("--int8-activations/--int8-silu: " + run.resume->path + " was trained with " +
                      quant::spelling(run.quant->activations) + " activations and SiLU " +
                      quant::spelling(run.quant->silu) + ", the run asks for " + c.int8_activations +
                      " and SiLU " + c.int8_silu,
                  "resume without those flags: a QAT run keeps the placement it was calibrated with");
    }
  } else {
    if (run.options.fine_tune.empty()) {
      throw Error("--qat fine-tunes a trained model: add --fine-tune WEIGHTS (or --resume a QAT run's checkpoint)",
                  "calibrated ranges of an untrained network mean nothing; train it first, then QAT for a few epochs");
    }
    const auto ds = data::spread(run.train_data, static_cast<std::size_t>(c.calibration_images));
    data::PipelineOptions lo;
    lo.batch_size = c.batch_size;
    lo.workers = static_cast<int>(c.workers);
    lo.max_image_pixels = c.max_image_pixels;
    const auto loader = make_eval_loader(ds, run.pre, lo);
    const auto activations = quant::parse_activations(c.int8_activations, "--int8-activations");
    const auto method = quant::parse_method(c.calibration_method, "--calibration-method");
    const auto silu = quant::parse_silu(c.int8_silu, "--int8-silu");
    auto plan = quant::calibrate(*run.model, *loader, run.rt, run.pre, activations, method, c.int8_reduce_range, silu,
                                 run.writer ? "qat calibration" : "");
    if (run.writer) {
      std::cout << "qat: " << plan.points.size() << " quantized tensors calibrated on " << ds->description() << " ("
                << c.calibration_method << ", " << c.int8_activations << " activations"
                << (c.int8_reduce_range ? ", 7-bit weights" : "") << ", SiLU " << c.int8_silu << ")\n";
    }
    run.quant = std::make_shared<quant::Plan>(std::move(plan));
  }
  run.model = std::make_shared<quant::FakeQuantNetworkImpl>(run.model, run.quant);
}

// --fusion: each block's path, tuned on CUDA for the micro-batch's shape; every rank runs rank 0's choices, so
// that the ranks' steps are one function.
void set_up_fusion(TrainingRun& run) {
  const auto& c = run.config;
  const auto mode = models::parse_fusion_mode(c.fusion);
  run.fused_bn = runtime::set_fusion(*run.model, run.rt, mode);
  if (c.evaluate) return;
  std::int64_t channels = 3;
  for (const auto& m : run.model->modules(/*include_self=*/false)) {
    if (const auto* conv = dynamic_cast<const models::Conv2dImpl*>(m.get())) {
      channels = conv->options.in_channels();
      break;
    }
  }
  const auto report = runtime::tune_fusion(*run.model, run.rt, mode,
                                           {c.batch_size, channels, run.pre.input_size, run.pre.input_size},
                                           c.tuning_cache);
  run.tuning = report.describe();
  if (report.shapes.empty()) return;
  if (run.group) {
    auto paths = models::block_paths(*run.model).to(run.rt.device);
    run.group->broadcast(paths);
    models::set_block_paths(*run.model, paths.cpu());
  }
  run.fused_bn = runtime::describe_fusion(*run.model, run.rt, mode);
}

// The model with its starting weights, on the device, SyncBN wired in.
void build_network(TrainingRun& run) {
  const auto& c = run.config;
  torch::manual_seed(static_cast<std::uint64_t>(c.seed));
  run.model = build_model(run.arch, model_options(run));
  if (run.resume) {
    check_resumable(run);
    load_weights(*run.model, *run.resume, "model.", run.arch);
  } else if (!run.options.fine_tune.empty()) {
    load_fine_tune(*run.model, run.options.fine_tune, run.arch, run.options.key_layout);
  } else if (c.evaluate && run.writer) {
    // As DLE's main.py --evaluate without weights: its benchmark mode times the network, whatever it knows.
    std::cerr << "convnets: note: --evaluate without --resume or --fine-tune evaluates randomly initialised weights "
                 "(as DLE's main.py does): its figures measure speed, not accuracy\n";
  }
  prepare_model(*run.model, run.rt);
  if (run.group && c.sync_bn) {
    // The group outlives the model's use of it: run_training owns both ends.
    models::enable_sync_batchnorm(*run.model, std::shared_ptr<models::BatchNormSync>(run.group, [](auto*) {}));
  }
  // QAT trains through the graph form (quant/eager.h), which fake-quantizes between BN and ReLU: nothing to fuse.
  if (!c.qat) set_up_fusion(run);
  if (c.qat) {
    start_qat(run);
  } else if (run.resume && run.resume->meta.contains("quantization")) {
    throw Error("--resume " + run.resume->path + " is a quantization-aware run", "resume it with --qat");
  }
}

// --asp: the optimizer goes behind AspOptimizer. Every conv/linear weight is
// listed, those left dense with the reason; an arch with no weight that can
// be 2:4 is refused.
void start_asp(TrainingRun& run) {
  const auto& c = run.config;
  if (!run.resume && run.options.fine_tune.empty() && c.asp_dense_epochs == 0) {
    throw Error("--asp prunes a trained model, and this run starts from random weights",
                "add --fine-tune WEIGHTS or --resume CHECKPOINT of a dense run (NVIDIA's ASP workflow), or "
                "--asp-dense-epochs N to train N epochs dense first");
  }
  auto layers = plan_2_4(*run.model, classifier_prefix(*run.model) + "weight");
  std::vector<std::string> dense;
  std::int64_t masked = 0, weights = 0, masked_weights = 0;
  for (const auto& l : layers) {
    std::int64_t n = 1;
    for (auto d : l.shape) n *= d;
    weights += n;
    if (l.masked()) ++masked, masked_weights += n;
    else dense.push_back(l.describe());
  }
  if (masked == 0) {
    throw Error("--asp: no weight of " + run.arch.name + " can be 2:4; left dense: " + join(dense, "; "),
                "2:4 sparsity needs conv/linear weights with a multiple of 16 input channels and of 8 outputs");
  }
  auto asp = std::make_unique<AspOptimizer>(std::move(run.optimizer), std::move(layers));
  run.asp = asp.get();
  run.optimizer = std::move(asp);
  if (!run.writer) return;
  std::cout << "asp: 2:4 masks on " << masked << " of " << masked + static_cast<std::int64_t>(dense.size())
            << " conv/linear weights (" << masked_weights << " of " << weights << " values), "
            << (c.asp_dense_epochs > 0 ? "after " + std::to_string(c.asp_dense_epochs) + " dense epochs"
                                       : std::string("before the first step"))
            << '\n';
  for (const auto& d : dense) std::cout << "     left dense: " << d << '\n';
}

// Optimizer, gradient reducer, loss scaler, teacher and EMA.
void build_training_state(TrainingRun& run) {
  const auto& c = run.config;
  OptimizerOptions oo;
  oo.kind = c.optimizer;
  oo.momentum = c.momentum;
  oo.nesterov = c.nesterov;
  oo.weight_decay = c.weight_decay;
  oo.decay_all = c.bn_weight_decay;
  oo.alpha = c.rmsprop_alpha;
  oo.eps = c.opt_eps;
  run.optimizer = make_optimizer(*run.model, oo);
  if (c.asp) start_asp(run);
  if (run.group) {
    run.reducer = std::make_unique<distributed::GradientReducer>(*run.group, run.optimizer->flat(), c.bucket_mb,
                                                                 /*broadcast_buffers=*/!c.sync_bn);
    run.reducer->broadcast_state(*run.model);  // ranks start bit-identical whatever they loaded
  }
  if (run.rt.loss_scaling) {
    if (c.static_loss_scale > 0) {
      // DLE's main.py: GradScaler(init_scale=static_loss_scale, growth_factor=2,
      // backoff_factor=0.5, growth_interval=100) (a fixed scale until its 2022
      // change; the name stayed).
      run.scaler = std::make_unique<LossScaler>(run.rt.device, c.static_loss_scale, 2.0, 0.5, 100);
    } else {
      run.scaler = std::make_unique<LossScaler>(run.rt.device);
    }
  }
  if (!c.teacher.empty()) run.teacher = load_teacher(c, run.num_classes, run.rt, run.teacher_pre);
  if (c.ema > 0) {
    Network shadow = build_model(run.arch, model_options(run));
    prepare_model(*shadow, run.rt);
    if (run.quant) shadow = std::make_shared<quant::FakeQuantNetworkImpl>(shadow, run.quant);
    run.ema = std::make_unique<Ema>(shadow, *run.model, c.ema, c.ema_warmup);
  }
}

// Optimizer, loss-scale and EMA state and the position of a resumed run.
void restore_resumed_state(TrainingRun& run) {
  const Checkpoint& r = *run.resume;
  run.optimizer->load_state(r.file, r.path);
  if (run.scaler) {
    // Switching to amp on resume starts a fresh scale; the reverse drops it.
    if (r.file.find("loss_scale.scale")) run.scaler->load_state(r.file, r.path);
  }
  if (run.ema) {
    if (r.section("ema.").tensors.empty()) {
      std::cout << "resume: " << r.path << " has no EMA; the EMA starts from the current weights\n";
    } else {
      load_weights(*run.ema->model(), r, "ema.", run.arch);
    }
  }
  if (run.asp && run.asp->pruned()) {
    // The masks of the run, not new ones from its trained weights.
    if (run.ema) run.asp->apply_to(*run.ema->model());
    if (run.writer) std::cout << "asp: 2:4 masks restored from " << r.path << '\n';
  }
  const auto& m = r.meta;
  run.position.epoch = m.at("epoch").get<std::int64_t>();
  run.position.step_in_epoch = m.value("step_in_epoch", std::int64_t{0});
  run.position.global_step = m.at("step").get<std::int64_t>();
  run.position.best_top1 = m.value("best_top1", -1.0);
  run.position.best_epoch = m.value("best_epoch", std::int64_t{-1});
}

void make_loaders(TrainingRun& run) {
  const auto& c = run.config;
  // DLE's GPUNet train.py gives the teacher the student's batch (its
  // useTwoRes is always false); --teacher-two-res loads at the teacher's size
  // and the step resizes for the student instead.
  run.load_size = c.teacher_two_res ? static_cast<int>(c.teacher_img_size) : run.pre.input_size;
  data::PipelineOptions lo;
  lo.batch_size = c.batch_size;
  lo.workers = static_cast<int>(c.workers);
  if (lo.workers == 0 && run.worker && run.worker->local_world_size > 1) {
    lo.workers = std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / run.worker->local_world_size);
  }
  lo.rank = run.rank;
  lo.world_size = run.world;
  lo.seed = static_cast<std::uint64_t>(c.seed);
  lo.bad_images = c.bad_images;
  lo.max_image_pixels = c.max_image_pixels;
  lo.prefetch = static_cast<int>(c.prefetch);
  if (!c.evaluate) {
    data::PipelineOptions t = lo;
    t.train = true;
    t.drop_last = true;
    t.image_size = run.load_size;
    t.crop_scale_min = c.crop_scale_min;
    t.crop_padding = static_cast<int>(c.crop_padding);
    t.flip = c.flip;
    t.interpolation = c.train_interpolation.empty() ? run.pre.interpolation : c.train_interpolation;
    t.augment = c.augment;
    t.mean = run.pre.mean;
    t.device_decode = use_device_decode(c.data_backend, run.rt);
    t.reprob = c.reprob;
    t.recount = static_cast<int>(c.recount);
    t.remode = c.remode;
    run.train_loader = data::make_loader(run.train_data, t);
  }
  if (run.val_data) run.val_loader = make_eval_loader(run.val_data, run.pre, lo);
  if (c.test_teacher && run.val_data) {
    // As GPUNet's loader_teacher_eval: the teacher's own preprocessing at --teacher-img-size.
    run.teacher_pre.input_size = c.teacher_img_size > 0 ? static_cast<int>(c.teacher_img_size) : run.pre.input_size;
    run.teacher_val_loader = make_eval_loader(run.val_data, run.teacher_pre, lo);
  }
}

}  // namespace

TrainingRun build_run(const TrainConfig& config, const RunOptions& options,
                      std::unique_ptr<distributed::Group>& group) {
  validate(config);
  const auto& c = config;
  const distributed::WorkerEnv* worker = options.dist && options.dist->world_size > 1 ? &*options.dist : nullptr;
  const Runtime rt = resolve_runtime(c.device, c.precision, c.memory_format, worker ? worker->local_rank : 0);
  distributed::resolve_backend(c.dist_backend, rt.device);  // a --dist-backend this machine cannot run fails every run
  // Connect first: a rank that fails later (bad data, an occupied workspace)
  // then reaches the others as a named failure instead of a rendezvous timeout.
  if (worker) group = std::make_unique<distributed::Group>(*worker, rt.device, c.dist_backend);
  TrainingRun run(config, options, find_architecture(c.arch));
  run.resume = options.resume ? &*options.resume : nullptr;
  run.worker = worker;
  run.rt = rt;
  run.group = group.get();
  run.world = group ? group->world_size() : 1;
  run.rank = group ? group->rank() : 0;
  run.writer = run.rank == 0;
  run.pre = resolve_preprocessing(run.arch, c);
  open_data(run);
  build_network(run);
  build_training_state(run);
  if (run.resume) restore_resumed_state(run);
  make_loaders(run);
  return run;
}

void plan_steps(TrainingRun& run) {
  const auto& c = run.config;
  run.steps_per_epoch = run.train_loader->batches_per_epoch() / run.micro_per_step;
  if (run.steps_per_epoch < 1) {
    throw Error("an epoch of " + std::to_string(run.train_loader->samples_per_epoch()) +
                " images is smaller than one optimizer batch of " + std::to_string(run.optimizer_batch),
                "lower --batch-size or --optimizer-batch-size");
  }
  ScheduleOptions so;
  so.kind = c.lr_schedule;
  so.per_epoch = c.lr_granularity == "epoch";
  run.base_lr = scaled_lr(c.lr, run.optimizer_batch, c.lr_reference_batch);
  so.base_lr = run.base_lr;
  so.warmup_epochs = c.warmup;
  so.steps = c.lr_steps;
  so.step_factor = c.lr_step_factor;
  so.end_lr = c.end_lr;
  so.warmup_lr = c.warmup_lr;
  so.decay_epochs = c.lr_decay_epochs;
  so.steps_per_epoch = run.steps_per_epoch;
  so.epochs = c.epochs;
  run.schedule.emplace(so);
  if (!run.resume) return;
  auto& pos = run.position;
  if (run.resume->meta.contains("imported_from")) {
    // Another tool's checkpoint is at an epoch's end; its step count is this run's.
    pos.global_step = pos.epoch * run.steps_per_epoch;
    return;
  }
  // A different world size (or batch, or accumulation) changes the images
  // per step; the checkpoint's position is converted through the images
  // consumed, which the batch-dealing sampler orders the same for any split.
  const std::int64_t old_world = run.resume->meta.value("world_size", std::int64_t{1});
  const std::int64_t old_step_images = checkpoint_images_per_step(run.resume->meta);
  if (old_step_images != run.optimizer_batch) {
    const std::int64_t consumed = pos.step_in_epoch * old_step_images;
    if (consumed % run.optimizer_batch != 0) {
      throw Error("--resume " + run.resume->path + " stopped " + std::to_string(consumed) + " images into epoch " +
                      std::to_string(pos.epoch + 1) + ", not a whole number of this run's steps of " +
                      std::to_string(run.optimizer_batch) + " images",
                  "resume with a step size (--batch-size x processes x micro-batches) that divides it, or from an "
                  "epoch-end checkpoint");
    }
    pos.step_in_epoch = consumed / run.optimizer_batch;
    pos.global_step = pos.epoch * run.steps_per_epoch + pos.step_in_epoch;
    if (run.writer) {
      std::cout << "resume: " << old_world << " process(es) x " << old_step_images / old_world << " -> " << run.world
                << " x " << run.optimizer_batch / run.world << " images per step; continuing at image " << consumed
                << " of epoch " << pos.epoch + 1 << '\n';
    }
  }
  if (pos.step_in_epoch >= run.steps_per_epoch) {
    throw Error("--resume " + run.resume->path + " stopped at step " + std::to_string(pos.step_in_epoch) +
                " of an epoch that now has " + std::to_string(run.steps_per_epoch) + " steps",
                "resume with the same data, --batch-size and --optimizer-batch-size");
  }
}

void prune_when_due(TrainingRun& run, std::int64_t epoch) {
  if (!run.asp || run.asp->pruned() || epoch < run.config.asp_dense_epochs) return;
  run.asp->prune();
  // Every rank holds the same weights, so computed the same masks; rank 0's
  // are made the law anyway, as they decide what all ranks train from here.
  if (run.group) {
    run.group->broadcast(run.asp->flat_mask());
    run.asp->reapply();
  }
  // From here the EMA averages masked weights: its pruned entries stay exactly 0.
  if (run.ema) run.asp->apply_to(*run.ema->model());
  if (run.writer) {
    std::cout << "asp: pruned to 2:4 at the start of epoch " << epoch + 1 << ": " << run.asp->masked_numel() / 2
              << " weights zeroed\n";
  }
}

bool best_by_ema(const TrainingRun& run) {
  return run.ema && (run.config.best_by == "ema" || run.config.best_by == "auto");
}

}  // namespace convnets::train
