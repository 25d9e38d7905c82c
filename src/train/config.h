// The training configuration: every recipe field, its default, JSON recipes, flag overrides and validation.
#pragma once

#include "codec/image.h"
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::train {

// Every field of the training configuration, once: its type, default, and the help of its flag. The field `a_b` is
// the flag `--a-b` and the recipe key "a_b", with DLE's meaning (--lr is the absolute learning rate); the defaults
// are DLE's ResNet-50 v1.5 recipe (README "Default configuration"). validate() checks them.
#define CONVNETS_TRAIN_FIELDS(X)                                                                                  \
  X(std::string, arch, "resnet50", "architecture name (convnets models) ")                                            \
  X(std::string, data, {}, "training data: image folder, PaddleClas list file, IDX folder (Fashion-MNIST) or synthetic[:N]") \
  X(std::string, val_data, {}, "validation data (default: the val split of DATA)")                                    \
  X(std::string, workspace, "runs/convnets", "folder for config.json, log.json and checkpoints")                      \
  X(std::int64_t, epochs, 90, "training epochs")                                                                      \
  X(std::int64_t, batch_size, 256, "images per step and process")                                                     \
  X(std::int64_t, optimizer_batch_size, 0, "images per optimizer step over all processes; a multiple of --batch-size x processes accumulates gradients (0 or DLE's -1: no accumulation)") \
  X(double, lr, 0.256, "learning rate, absolute as in DLE (per --lr-reference-batch images when that is set)")        \
  X(std::int64_t, lr_reference_batch, 0, "batch a recipe's --lr refers to; the LR scales linearly with the optimizer batch (0: absolute). A --lr flag without this flag sets it to 0") \
  X(std::string, lr_schedule, "cosine", "step | linear | cosine | staircase (timm's --sched step: decay every --lr-decay-epochs)") \
  X(std::string, lr_granularity, "epoch", "epoch: the LR changes once per epoch, as DLE and timm | step: every optimizer step") \
  X(double, warmup, 8, "epochs of linear LR warmup")                                                                  \
  X(double, warmup_lr, 0, "LR at the first warmup step, rising linearly to --lr (0: --lr / warmup steps, as DLE)")    \
  X(double, lr_decay_epochs, 2.4, "staircase schedule: multiply the LR by --lr-step-factor every this many epochs (fractions allowed)") \
  X(std::vector<double>, lr_steps, (std::vector<double>{30, 60, 80}), "step schedule: epochs where the LR is multiplied by --lr-step-factor") \
  X(double, lr_step_factor, 0.1, "step schedule: LR multiplier at each of --lr-steps")                                \
  X(double, end_lr, 0, "cosine/linear: LR at the last step")                                                          \
  X(std::string, optimizer, "sgd", "sgd | rmsproptf (timm's RMSpropTF: TF-style epsilon inside the square root) | rmsprop (torch.optim.RMSprop, DLE's)") \
  X(double, momentum, 0.875, "SGD / RMSprop momentum")                                                                \
  X(double, rmsprop_alpha, 0.9, "rmsproptf, rmsprop: smoothing constant of the squared-gradient average")             \
  X(double, opt_eps, 1e-3, "rmsproptf: epsilon added inside the square root; rmsprop: added to the root (DLE's --rmsprop-eps)") \
  X(bool, nesterov, false, "Nesterov momentum")                                                                       \
  X(double, weight_decay, 1.0 / 32768, "L2 weight decay")                                                             \
  X(bool, bn_weight_decay, false, "also decay BN parameters and biases")                                              \
  X(double, label_smoothing, 0.1, "label smoothing factor")                                                           \
  X(double, mixup, 0, "mixup alpha (0: off)")                                                                         \
  X(double, cutmix, 0, "CutMix alpha (Yun et al. 2019, as timm's Mixup; 0: off)")                                     \
  X(double, mixup_prob, 1.0, "timm: probability that a batch is mixed (mixup or cutmix)")                             \
  X(double, mixup_switch_prob, 0.5, "timm: with --mixup and --cutmix both on, the probability of cutmix for a batch") \
  X(std::string, augment, {}, "augmentation policy after the crop: autoaugment (DLE's ImageNet policy) | a timm RandAugment string such as rand-m9-mstd0.5 (DLE: --augmentation, timm: --aa)") \
  X(double, reprob, 0, "random erasing probability per image (timm's RandomErasing, on the normalised batch)")        \
  X(std::string, remode, "pixel", "random erasing fill: const (the mean) | rand (a random colour per box) | pixel (noise per pixel)") \
  X(std::int64_t, recount, 1, "random erasing: boxes per erased image")                                               \
  X(double, ema, 0, "decay of the weight EMA evaluated beside the model (0: off; DLE's --use-ema)")                   \
  X(bool, ema_warmup, true, "EMA decay min(--ema, (1 + step) / (10 + step)) as DLE's EMA (--no-ema-warmup: constant, as timm)") \
  X(std::string, best_by, "auto", "the top-1 that picks best.safetensors: model (DLE) | ema (timm with --model-ema) | auto: ema when --ema is on") \
  X(double, dropout, -1, "dropout before the classifier (negative: the arch's; GPUNet 0.2)")                          \
  X(double, drop_path, -1, "drop-path (stochastic depth) rate of the deepest block, linear in depth (negative: the arch's; GPUNet 0.2)") \
  X(std::string, teacher, {}, "knowledge distillation: the teacher's arch (a name or a GPUNet .json); adds a soft-target loss") \
  X(std::string, teacher_checkpoint, {}, "knowledge distillation: the teacher's weights (checkpoint or safetensors)") \
  X(std::int64_t, teacher_img_size, 0, "knowledge distillation: the teacher's evaluation size (--test-teacher), as DLE's GPUNet train.py; with --teacher-two-res also its training size (0: the student's)") \
  X(bool, teacher_two_res, false, "knowledge distillation: images load at --teacher-img-size for the teacher and the student gets them resized (bicubic); off: the teacher sees the student's batch, as DLE") \
  X(bool, test_teacher, false, "knowledge distillation: validate the teacher before training and print its accuracy (GPUNet's --test-teacher)") \
  X(bool, asp, false, "2:4 structured sparsity (NVIDIA's ASP): prune every eligible conv/linear weight to 2 of each 4 input channels by magnitude, then train with the masks kept (needs --fine-tune, --resume or --asp-dense-epochs)") \
  X(std::int64_t, asp_dense_epochs, 0, "--asp from scratch: epochs trained dense before the weights are pruned (0: prune at the start)") \
  X(std::string, precision, "fp32", "fp32 | tf32 | amp | bf16 (--amp: amp)")                                          \
  X(double, static_loss_scale, 0, "amp: the initial loss scale, doubled after 100 clean steps and halved on overflow, as DLE's GradScaler (0: from 65536, doubled after 2000)") \
  X(std::string, memory_format, "nhwc", "nhwc (channels-last) | nchw")                                                \
  X(bool, cuda_graph, true, "on CUDA, capture the whole training step in a CUDA graph and replay it (off with mixup)") \
  X(std::string, fusion, "auto", "training on CUDA in amp or bf16, NHWC: auto (each residual block's verified paths timed at the start, the fastest kept and cached) | none (separate ops) | bn (BN+ReLU and BN+add+ReLU as one cuDNN call, Paddle's fused_bn_add_act, with or without the block input's gradients summed in the dgrad) | normconv (MLPerf's NormConv: BN statistics in the convolutions; its numerics are not yet verified); --no-fused-bn: none, --norm-conv: normconv") \
  X(std::string, tuning_cache, {}, "--fusion auto's cache of timed choices, per GPU, cuDNN, dtype and shape (default: $XDG_CACHE_HOME/convnets/tuning.json; none: no file)") \
  X(std::string, device, "auto", "auto | cpu | cuda")                                                                 \
  X(bool, sync_bn, false, "data-parallel runs: BatchNorm statistics over the global batch (torch.nn.SyncBatchNorm)")  \
  X(double, bucket_mb, 25, "data-parallel runs: gradient all-reduce bucket size in MiB (DDP's bucket_cap_mb)")        \
  X(std::string, dist_backend, "auto", "data-parallel runs: auto | gloo | nccl (auto: nccl for CUDA, gloo for CPU)")  \
  X(std::int64_t, seed, 0, "seed of initialisation, data order, augmentation and mixup")                              \
  X(std::int64_t, workers, 0, "data loader threads (0: one per CPU)")                                                 \
  X(std::int64_t, prefetch, 2, "batches each loader thread prepares ahead")                                           \
  X(std::string, data_backend, "auto", "auto | cpu | gpu: decode on the loader threads, or entropy-decode there and finish on the GPU (auto: cpu; DLE's pytorch and dali-cpu are cpu, dali-gpu is gpu)") \
  X(std::int64_t, prof, 0, "stop after this many optimizer steps (0: full run)")                                      \
  X(std::int64_t, run_epochs, 0, "stop after this many epochs of this invocation, the schedule still spanning --epochs (DLE; 0 or -1: all)") \
  X(std::int64_t, early_stopping_patience, -1, "stop when validation top-1 has not improved for this many epochs (DLE's; -1 or 0: off)") \
  X(bool, training_only, false, "skip validation")                                                                    \
  X(bool, evaluate, false, "only validate the weights of --resume or --fine-tune")                                    \
  X(std::int64_t, print_freq, 50, "steps between progress lines when stdout is not a terminal")                       \
  X(bool, checkpoints, true, "save checkpoints (--no-checkpoints: none, as DLE; an interrupted run then cannot resume)") \
  X(std::string, raport_file, "log.json", "the DLLogger JSON log's file name in the workspace (DLE's --raport-file)") \
  X(std::int64_t, save_every, 0, "also save epoch-N checkpoints every N epochs (0: off; --gather-checkpoints: every epoch)") \
  X(std::int64_t, keep, 0, "how many epoch-N checkpoints to keep (0: all)")                                           \
  X(double, checkpoint_interval, -1, "minutes between checkpoints saved mid-epoch (last.safetensors) at a step boundary, written in the background while training goes on (0: off; negative: 10 on multi-process runs, off on one)") \
  X(std::string, resume_batch, "recipe", "a --resume on another number of processes: recipe (the checkpoint's images per optimizer step kept through the per-process batch and gradient accumulation, as DLE's --optimizer-batch-size) | as-given (--batch-size per process as given: the images per step change with the processes)") \
  X(std::int64_t, checkpoint_every_steps, 0, "also save last.safetensors in the background every N optimizer steps (0: off)") \
  X(std::int64_t, image_size, 0, "training and eval crop size (0: the arch's)")                                       \
  X(double, crop_ratio, 0, "eval: resize to size / ratio, then centre-crop (0: the arch's)")                          \
  X(std::string, interpolation, {}, "eval resizing filter, and training's unless --train-interpolation: bilinear | bicubic (PIL's antialiased; default: the arch's, DLE's ResNets bilinear, GPUNets bicubic)") \
  X(std::string, train_interpolation, {}, "training resizing filter: bilinear | bicubic | random (timm's: either, per image; default: as --interpolation)") \
  X(std::vector<double>, mean, {}, "normalisation mean, RGB on the 0..1 scale (default: the arch's)")                 \
  X(std::vector<double>, std, {}, "normalisation std, RGB (default: the arch's)")                                     \
  X(double, crop_scale_min, 0.08, "RandomResizedCrop: smallest area fraction (1: no crop)")                           \
  X(std::int64_t, crop_padding, 0, "after the resized crop, torchvision's RandomCrop(size, padding=N): shifts of up to N px, zero fill (0: off)") \
  X(bool, flip, true, "random horizontal flip")                                                                       \
  X(std::string, init, "fan_in", "conv init: fan_in (DLE) | fan_out (torchvision)")                                   \
  X(bool, zero_init_residual, false, "zero the last BN of each residual branch")                                      \
  X(std::int64_t, top_k, 5, "report top-k accuracy besides top-1")                                                    \
  X(std::int64_t, num_classes, 0, "classes of the classifier; must equal the data's (0: the data's)")                 \
  X(std::string, bad_images, "skip", "skip | fail: what an undecodable image does")                                   \
  X(std::int64_t, max_image_pixels, codec::kDefaultMaxImagePixels, codec::kMaxImagePixelsHelp)                        \
  X(bool, tensorboard, false, "also write TensorBoard event files: log.json's scalars, the config, the first batch's images") \
  X(std::string, tensorboard_dir, {}, "--tensorboard's folder (default: WORKSPACE/tensorboard)")                      \
  X(bool, qat, false, "quantization-aware training: fine-tune with INT8 fake quantization where `export --int8` quantizes (needs --fine-tune, or --resume of a QAT run)") \
  X(std::int64_t, calibration_images, 512, "--qat: training images (spread over the data) its activation ranges are calibrated on first") \
  X(std::string, calibration_method, "percentile", "--qat: minmax | percentile (99.99% of |x|) | entropy (TensorRT's KL)") \
  X(std::string, int8_activations, "uint8", "--qat: uint8 (ONNX Runtime, OpenVINO) | int8 (symmetric: TensorRT)")     \
  X(bool, int8_reduce_range, false, "--qat: 7-bit weights (ONNX Runtime on x86 CPUs without VNNI)")                   \
  X(std::string, int8_silu, "ops", "--qat: ops (a SiLU quantized as its Sigmoid and Mul: ONNX Runtime's integer kernels) | float (in float after its conv, quantized once: OpenVINO fuses it)") \
  X(std::int64_t, max_train_images, 0, "use only the first N training samples (0: all)")                              \
  X(std::int64_t, max_val_images, 0, "use only the first N validation samples (0: all)")                              \
  X(std::int64_t, holdout, 0, "validate on N training samples held out of training (every size/N-th), not the val split: tuning that never sees the test set (0: off)")

// Field names follow NVIDIA DeepLearningExamples' ConvNets main.py flags (--lr, --warmup, --label-smoothing,
// --mixup, --optimizer-batch-size, ...).
struct TrainConfig {
#define CONVNETS_TRAIN_FIELD(type, name, value, help) type name = value;
  CONVNETS_TRAIN_FIELDS(CONVNETS_TRAIN_FIELD)
#undef CONVNETS_TRAIN_FIELD
};


nlohmann::ordered_json to_json(const TrainConfig& c);

// Fields absent from `j` keep their current value in `c`; an unknown field or a
// value of the wrong type throws Error naming the field and `source`. DLE's
// names for values are read as convnets' (arch resnext101-32x4d, data backend
// pytorch / dali-cpu / dali-gpu).
void apply_json(TrainConfig& c, const nlohmann::json& j, const std::string& source);

// Every range and choice; the error names the flag (--batch-size ...).
void validate(const TrainConfig& c);

// A run made shorter than its recipe's warm-up (`--epochs 1` as a smoke test,
// a line DLE's main.py and timm's train.py both run) keeps the recipe's shape:
// the warm-up shrinks by the same factor as the epochs (whole epochs under
// --lr-granularity epoch, so possibly to 0). `planned_epochs` is the recipe's
// (or checkpoint's) epoch count before the flags. Returns the note to print,
// or "" when the warm-up already fits. Callers skip it when --warmup was given.
std::string fit_warmup(TrainConfig& c, double planned_epochs);

// A flag's text as its field's value, of the field's type (that of its default): an integer, a number, numbers
// separated by commas, or text. Throws Error naming the flag and what it expects.
nlohmann::json parse_field(const std::string& field, const std::string& text);

// The flag of a field: "batch_size" -> "--batch-size".
std::string flag_for(const std::string& field);

// One-line help per field, for the CLI.
const char* field_help(const std::string& field);

// A recipe by name (a file shipped in recipes/, embedded in the binary) or by
// path to a JSON file. Throws Error listing the built-in names.
nlohmann::json load_recipe(const std::string& name_or_path);
std::vector<std::string> builtin_recipes();

}  // namespace convnets::train
