// The training step's tuner: each residual block shape's admitted, verified fusion paths timed on the GPU the run is on, the fastest kept, and the choices cached per GPU, cuDNN version, dtype and shape (TensorRT's tactic selection, done for a training step).
#pragma once

#include "models/fusion.h"

#include <torch/nn/module.h>

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace convnets::runtime {

// What a measurement is only true of: the GPU (its name and SM count), the cuDNN that ran it and the convnets whose
// kernels and paths it timed. A cache entry of another one is stale.
struct TuningDevice {
  std::string gpu;        // "NVIDIA H100 80GB HBM3"
  int sms = 0;            // streaming multiprocessors: a cut-down part of the same name differs
  long cudnn = 0;         // cudnnGetVersion(): 91900
  std::string convnets;   // CONVNETS_VERSION
  std::string str() const;  // "NVIDIA H100 80GB HBM3 (132 SMs), cuDNN 91900, convnets 0.1.0"
  bool operator==(const TuningDevice& o) const {
    return gpu == o.gpu && sms == o.sms && cudnn == o.cudnn && convnets == o.convnets;
  }
};

// One path of one block shape: how long its forward and backward took alone, or why it is not a candidate.
struct Candidate {
  models::FusionPath path = models::FusionPath::Unfused;
  double ms = 0;           // per forward + backward of the block, the best of the interleaved rounds
  std::string refusal;     // "" where it ran: else why not (the block cannot run it, unverified, it failed)
  std::string numerics;    // its output and gradients against the unfused path's on the same input ("" if not run)
  bool numerics_ok = true;
};

// The decision for the blocks of one shape (ResNet-50's 16 blocks are 8 shapes).
struct ShapeChoice {
  std::string key;                   // the block's signature, its input's sizes, dtype and layout
  std::vector<std::string> blocks;   // state_dict prefixes: layer1.1, layer1.2
  std::vector<Candidate> candidates; // each admitted path, timed or refused
  models::FusionPath chosen = models::FusionPath::Unfused;
  bool from_cache = false;
  std::string note;                  // a forced path that failed its numerics check, say
};

// The fastest candidate that ran (and, with `require_numerics`, passed its check); one within `tie` (relative) of the
// fastest goes to the one earlier in all_fusion_paths()'s order, the simpler. None where no candidate ran.
std::optional<models::FusionPath> fastest(const std::vector<Candidate>& candidates, bool require_numerics = true,
                                          double tie = 0.01);

// The choices of earlier runs: a JSON file of entries per device. Entries of other devices are kept (one cache may
// serve several GPUs of a shared home) but never used, and stale() names them.
class TuningCache {
 public:
  // Reads `path` where it exists; an unreadable file is neither used nor overwritten (note() says so).
  TuningCache(std::string path, TuningDevice device);
  const ShapeChoice* find(const std::string& key) const;
  void record(const ShapeChoice& choice);
  // Writes the file atomically (its folder made first); false, with note() saying why, where it cannot.
  bool save();
  const std::string& path() const { return path_; }
  // "3 shapes measured on NVIDIA H200 (132 SMs), cuDNN 91900, convnets 0.1.0: not this GPU; ignored"; "" if none.
  std::string stale() const;
  const std::string& note() const { return note_; }

 private:
  std::string path_;
  TuningDevice device_;
  std::map<std::string, ShapeChoice> mine_;
  std::vector<std::pair<TuningDevice, std::string>> others_;  // each other device's entries, as read (JSON text)
  bool readable_ = true;
  std::string note_;
};

// $XDG_CACHE_HOME/convnets/tuning.json, else $HOME/.cache/convnets/tuning.json; "" where neither is set.
std::string default_tuning_cache();

// Runs one block on each of `paths` on an input of `sizes` (its signature's shape) in `dtype`, and times its
// forward and backward: the GPU's timer on CUDA (block_timer.h), injected timings in the tests.
class BlockTimer {
 public:
  virtual ~BlockTimer() = default;
  virtual std::vector<Candidate> time(torch::nn::Module& block, models::FusionTunable& tunable,
                                      const std::vector<models::FusionPath>& paths,
                                      const std::vector<std::int64_t>& sizes, at::ScalarType dtype) = 0;
};

struct TuneReport {
  models::FusionMode mode = models::FusionMode::Auto;
  std::vector<ShapeChoice> shapes;
  double seconds = 0;        // the tuning's own time, timing and numerics checks included
  int timed = 0, cached = 0; // shapes timed now, shapes taken from the cache
  std::string cache_path;    // "" without a cache
  std::string cache_note;    // stale entries ignored, an unreadable or unwritable file
  // The start line's account: what each block shape runs and why, then the cache's part.
  std::string describe() const;
};

// Sets each tunable block of `model` (whose last training forward recorded its input) to the path `context.mode`
// admits and the timings favour: one admitted path is set without timing; several are timed, once per shape, unless
// `cache` holds the shape (its choice still admitted and possible); new timings are put into `cache` (saved by the
// caller). In auto, an unverified path or one whose numerics differ from the unfused path's is not a candidate.
TuneReport tune(torch::nn::Module& model, const models::FusedBnContext& context, BlockTimer& timer,
                TuningCache* cache);

// The shape key of a block: its signature, input sizes, dtype and memory format.
std::string shape_key(const models::FusionTunable& block, at::ScalarType dtype, bool channels_last);

}  // namespace convnets::runtime
