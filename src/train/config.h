// The training configuration: every recipe field, its default, JSON recipes, flag overrides and validation.
#pragma once

#include "codec/image.h"
#include <nlohmann/json.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace convnets::train {

// Field names follow NVIDIA DeepLearningExamples' ConvNets main.py flags
// (--lr, --warmup, --label-smoothing, --mixup, --optimizer-batch-size, ...);
// each field `a_b` is also the flag `--a-b`, with DLE's meaning (--lr is the
// absolute learning rate). Defaults are DLE's ResNet-50 v1.5 recipe (README
// "Default configuration").
struct TrainConfig {
  std::string arch = "resnet50";
  std::string data;       // training data: image folder, list file, IDX folder or synthetic[:N]
  std::string val_data;   // empty: the "val" split of `data`
  std::string workspace = "runs/convnets";
  std::int64_t epochs = 90;
  std::int64_t batch_size = 256;            // per process
  std::int64_t optimizer_batch_size = 0;    // over all processes (DLE); 0 or -1: batch_size x processes; a multiple accumulates
  double lr = 0.256;                        // absolute, as DLE's --lr; per `lr_reference_batch` images when that is set
  std::int64_t lr_reference_batch = 0;      // > 0: linear scaling (Goyal et al. 2017) from this batch; 0: none (DLE)
  std::string lr_schedule = "cosine";       // step | linear | cosine | staircase
  std::string lr_granularity = "epoch";     // epoch: the LR changes at epoch starts (DLE, timm) | step
  double warmup = 8;                        // epochs of linear warmup (fractions allowed)
  double warmup_lr = 0;                     // LR at the first warmup step; 0: DLE's base / warmup steps
  double lr_decay_epochs = 2.4;             // staircase: epochs between multiplications by lr_step_factor
  std::vector<double> lr_steps{30, 60, 80}; // step schedule: epochs where the LR is multiplied
  double lr_step_factor = 0.1;
  double end_lr = 0;                        // cosine/linear: LR reached at the last step
  std::string optimizer = "sgd";            // sgd | rmsproptf | rmsprop
  double momentum = 0.875;
  bool nesterov = false;
  double rmsprop_alpha = 0.9;               // rmsproptf, rmsprop: decay of the squared-gradient average
  double opt_eps = 1e-3;                    // rmsproptf: epsilon inside the square root (TF); rmsprop: outside it
  double weight_decay = 3.0517578125e-05;   // 1/32768
  bool bn_weight_decay = false;             // also decay BN parameters and biases
  double label_smoothing = 0.1;
  double mixup = 0;                         // Beta(alpha, alpha); 0 disables
  double cutmix = 0;                        // CutMix Beta(alpha, alpha) (timm); 0 disables
  double mixup_prob = 1.0;                  // timm: probability that a batch is mixed at all (mixup or cutmix)
  double mixup_switch_prob = 0.5;           // timm: with both on, the probability of cutmix rather than mixup
  std::string augment;                      // "" | autoaugment (DLE) | rand-m9-mstd0.5 (timm's RandAugment)
  double reprob = 0;                        // timm's random erasing probability per image
  std::string remode = "pixel";             // const | rand | pixel (timm's train.py default)
  std::int64_t recount = 1;                 // erased boxes per image
  double ema = 0;                           // decay of the weight EMA; 0 disables
  bool ema_warmup = true;                   // DLE's decay min(ema, (1 + t) / (10 + t)) at step t; timm has none
  std::string best_by = "auto";             // which top-1 picks best.safetensors: model | ema | auto (ema when on, as timm)
  double dropout = -1;                      // before the classifier; negative: the arch's (GPUNet 0.2)
  double drop_path = -1;                    // stochastic depth of the deepest block; negative: the arch's
  std::string teacher;                      // knowledge distillation: the teacher's arch (name or .json)
  std::string teacher_checkpoint;           // its weights (a convnets checkpoint or weights file)
  std::int64_t teacher_img_size = 0;        // the teacher's evaluation size (--test-teacher); 0: the student's
  bool teacher_two_res = false;             // images load at teacher_img_size, the student gets them resized
  bool test_teacher = false;                // validate the teacher before training (GPUNet's --test-teacher)
  bool asp = false;                         // 2:4 structured sparsity (train/asp.h): prune, then keep the masks
  std::int64_t asp_dense_epochs = 0;        // --asp: epochs trained dense before pruning (from scratch; 0: at the start)
  std::string precision = "fp32";           // fp32 | tf32 | amp | bf16
  double static_loss_scale = 0;             // amp, DLE: the initial loss scale, grown after 100 clean steps (0: GradScaler's defaults)
  std::string memory_format = "nhwc";       // nhwc (channels-last) | nchw
  std::string device = "auto";              // auto | cpu | cuda
  bool cuda_graph = true;                   // CUDA: replay the whole step as one graph (not with mixup)
  std::string fusion = "auto";              // CUDA, fp16/bf16, NHWC: auto (each block's fastest verified path) | none | bn | normconv
  std::string tuning_cache;                 // the step tuner's choices; "": $XDG_CACHE_HOME/convnets/tuning.json; none: no file
  bool sync_bn = false;                     // data-parallel: BN statistics over the global batch
  double bucket_mb = 25;                    // data-parallel: gradient bucket size (DDP's default)
  std::string dist_backend = "auto";        // auto | gloo | nccl
  std::int64_t seed = 0;
  std::int64_t workers = 0;                 // loader threads; 0: one per CPU
  std::int64_t prefetch = 2;                // batches prepared ahead per loader thread (DLE's --prefetch)
  std::int64_t prof = 0;                    // stop after this many optimizer steps; 0: full run
  std::int64_t run_epochs = 0;              // DLE: stop after this many epochs of this invocation; 0 (or -1): all
  std::int64_t early_stopping_patience = -1;  // DLE: stop after this many epochs without a better top-1; <= 0: off
  bool training_only = false;               // skip validation
  bool evaluate = false;                    // validate only (needs --resume or --fine-tune weights)
  std::int64_t print_freq = 50;             // steps between progress lines when not on a terminal
  bool checkpoints = true;                  // false: DLE's --no-checkpoints, no checkpoint is written
  std::string raport_file = "log.json";     // the DLLogger log in the workspace (DLE's --raport-file)
  std::int64_t save_every = 0;              // also keep epoch-N checkpoints every N epochs
  std::int64_t keep = 0;                    // how many of those to keep; 0: all
  std::int64_t image_size = 0;              // 0: the arch's input size
  double crop_ratio = 0;                    // eval resize = size / crop_ratio; 0: the arch's
  std::string interpolation;                // eval (and default training) filter: bilinear | bicubic; empty: the arch's
  std::string train_interpolation;          // bilinear | bicubic | random (timm's); empty: as interpolation
  std::vector<double> mean;                 // RGB, 0..1 scale; empty: the arch's
  std::vector<double> std;
  double crop_scale_min = 0.08;             // RandomResizedCrop area fraction lower bound
  std::int64_t crop_padding = 0;            // then RandomCrop(size, padding=N); 0: off
  bool flip = true;
  std::string init = "fan_in";              // fan_in (DLE) | fan_out (torchvision)
  bool zero_init_residual = false;
  std::int64_t top_k = 5;                   // reported besides top-1 (capped at the class count)
  std::int64_t num_classes = 0;             // the classifier's size, checked against the data (DLE); 0: the data's
  std::string bad_images = "skip";
  std::int64_t max_image_pixels = codec::kDefaultMaxImagePixels;  // refuse larger images (0: no limit)
  bool tensorboard = false;                      // TensorBoard event files beside log.json (rank 0)
  std::string tensorboard_dir;                   // empty: WORKSPACE/tensorboard
  bool qat = false;                              // quantization-aware training (quant/eager.h)
  std::int64_t calibration_images = 512;         // QAT: training images its ranges are calibrated on
  std::string calibration_method = "percentile"; // minmax | percentile | entropy
  std::string int8_activations = "uint8";        // uint8 | int8
  bool int8_reduce_range = false;                // 7-bit weights
  std::string int8_silu = "ops";                 // ops | float (quant::Silu)
  std::string data_backend = "auto";  // auto | cpu | gpu (train/runtime.h use_device_decode)
  std::int64_t max_train_images = 0;        // use only the first N samples; 0: all
  std::int64_t max_val_images = 0;
  std::int64_t holdout = 0;  // validate on N samples held out of the training split instead of the val split
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

// The flag of a field: "batch_size" -> "--batch-size".
std::string flag_for(const std::string& field);

// One-line help per field, for the CLI.
const char* field_help(const std::string& field);

// A recipe by name (a file shipped in recipes/, embedded in the binary) or by
// path to a JSON file. Throws Error listing the built-in names.
nlohmann::json load_recipe(const std::string& name_or_path);
std::vector<std::string> builtin_recipes();

}  // namespace convnets::train
