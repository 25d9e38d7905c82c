// INT8 quantization of a network's graph: where activations are quantized (the QDQ placement), their calibrated ranges, and the scales they give.
#pragma once

#include "models/graph.h"

#include <nlohmann/json_fwd.hpp>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <vector>

namespace convnets::quant {

// How activations are stored. Weights are always int8, symmetric, one scale
// per output channel (TensorRT's and ONNX Runtime's convention: it commutes
// with BN folding, which scales each output channel).
enum class Activations {
  // uint8 with a zero point from the range; a ReLU after a conv or add is
  // folded into that tensor's quantizer (range [0, max], zero point 0). This
  // is the form ONNX Runtime's CPU kernels (QLinearConv, U8S8) and OpenVINO
  // run in integer arithmetic end to end.
  UInt8,
  // int8, symmetric (zero point 0), ReLU kept: the only activation form
  // TensorRT's explicit quantization accepts.
  Int8,
};

// Where a SiLU (x * sigmoid(x)) on a compute op's output (a conv in every
// network here) is quantized. The two
// CPU runtimes want different graphs of the same network (measured on
// GPUNet-0, docs/PERFORMANCE.md, issue 35): ONNX Runtime runs the Ops form in
// integer kernels (QLinearSigmoid, QLinearMul) and the Float form with a
// float conv; OpenVINO fuses the Float form into the conv and leaves the Ops
// form as float dequantize arithmetic.
enum class Silu {
  Ops,    // its input and its sigmoid's output quantized, as the two ops (ONNX Runtime)
  Float,  // computed in float on the conv's output, quantized once after it (OpenVINO, TensorRT's fusions)
};

// How a tensor's range is chosen from the calibration images.
enum class Method {
  MinMax,      // the extremes seen
  Percentile,  // |x| at kPercentile of the values seen (pytorch-quantization's percentile calibrator)
  Entropy,     // TensorRT's entropy calibration: the |x| threshold minimising KL(P || Q)
};

constexpr double kPercentile = 99.99;

Activations parse_activations(const std::string& s, const std::string& flag);
Method parse_method(const std::string& s, const std::string& flag);
Silu parse_silu(const std::string& s, const std::string& flag);
// Each as its flag spells it: parse_*'s inverse.
std::string spelling(Activations a);
std::string spelling(Method m);
std::string spelling(Silu s);

// One quantized activation tensor of the graph. Points are numbered in the
// order the placement first quantizes them, which is the order emit() visits
// the network: the same network always gives the same list.
struct Point {
  std::string site;   // what first consumes it ("layer1.0.conv1", "add 3", ...): messages and matching
  bool relu = false;  // the ReLU that follows is folded into this quantizer (Activations::UInt8)
  double lo = 0, hi = 0;  // the range represented
};

// The affine map of a point: q = clamp(round(x / scale) + zero_point, qmin, qmax).
struct Params {
  double scale = 1;
  std::int64_t zero_point = 0;
  std::int64_t qmin = 0, qmax = 255;
};
Params activation_params(const Point& p, Activations a);

// Weights: q in [-qmax, qmax], zero point 0 (symmetric, narrow range as
// ONNX Runtime's symmetric int8 weights). qmax 127; 63 with reduce_range:
// ONNX Runtime's U8S8 kernels on x86 CPUs without VNNI add pairs of u8 x s8
// products in int16 (vpmaddubsw), which saturates with 8-bit weights
// (its quantization guide's "reduce_range").
std::int64_t weight_qmax(bool reduce_range);
// Per output channel (dimension 0) max|w| / qmax, in float; 1 for an all-zero channel.
at::Tensor weight_scales(const at::Tensor& w, std::int64_t qmax);

// A network's calibrated quantization: what an INT8 export and QAT need.
struct Plan {
  Activations activations = Activations::UInt8;
  Method method = Method::Percentile;
  bool reduce_range = false;  // 7-bit weights (weight_qmax)
  Silu silu = Silu::Ops;      // plans written before the choice existed are Ops
  std::int64_t images = 0;    // calibration images
  std::vector<Point> points;
};
nlohmann::json to_json(const Plan& plan);
// `where` names the file for errors.
Plan plan_from_json(const nlohmann::json& j, const std::string& where);

// Range statistics of one point over the calibration images: min/max in a
// first pass, then (percentile, entropy) a histogram of |x| over [0, amax].
struct Observer {
  static constexpr int kBins = 2048;
  double min = 0, max = 0;
  bool seen = false;
  std::vector<double> hist;  // empty in the first pass
  double hist_max = 0;
  void add_minmax(const at::Tensor& x);
  void add_histogram(const at::Tensor& x);
};
// The range of `o` under `method` (levels: 256 for a non-negative uint8 tensor, else 128 per sign).
void choose_range(Point& p, const Observer& o, Method method, Activations a);
// TensorRT's entropy calibration on a histogram of |x| (bins over [0, hist_max]):
// the threshold whose `levels`-level quantization of the clipped distribution
// is closest to it in KL divergence; ties go to the larger threshold.
double entropy_threshold(const std::vector<double>& hist, double hist_max, int levels);
double percentile_threshold(const std::vector<double>& hist, double hist_max, double percent);

// What the placement asks of an interpreter (the ONNX writer, the eager torch one).
class Backend {
 public:
  virtual ~Backend() = default;
  // `x` quantized and dequantized as `points[index]` says (clipped at 0 first
  // when the point folds a ReLU): a new value.
  virtual GraphEmitter::Value quantize(const GraphEmitter::Value& x, std::size_t index) = 0;
};

// The QDQ placement, in front of `inner`: every input of a conv, linear, add,
// mul, sigmoid, pool and flatten is quantized (ONNX Runtime's QDQ form, which
// TensorRT's explicit quantization also reads: DQ -> op -> Q around each
// op); max pool and flatten keep their input's quantization, so the runtime
// can drop the pair around them. A SiLU on a conv's output is quantized as
// `silu` says. The network's output (the classifier's
// logits) stays float. With `creating`, points missing from `points` are
// appended (calibration's first pass); otherwise the network must visit
// exactly the listed points, or the ranges belong to another network.
class QdqEmitter : public GraphEmitter {
 public:
  QdqEmitter(GraphEmitter& inner, Backend& backend, std::vector<Point>& points, Activations activations, Silu silu,
             bool creating);
  ~QdqEmitter() override = default;

  Value conv_bn(const Value& x, const models::Conv2dImpl& conv, const std::string& conv_name,
                const models::BatchNorm2dImpl& bn, const std::string& bn_name) override;
  Value conv(const Value& x, const models::Conv2dImpl& conv, const std::string& name) override;
  Value linear(const Value& x, const models::LinearImpl& fc, const std::string& name) override;
  Value linear_1x1(const Value& x, const models::LinearImpl& fc, const std::string& name) override;
  Value relu(const Value& x) override;
  Value silu(const Value& x) override;  // x * sigmoid(x): as its two ops, or in float (Silu::Float)
  Value sigmoid(const Value& x) override;
  Value add(const Value& a, const Value& b) override;
  Value mul(const Value& a, const Value& b) override;
  Value max_pool(const Value& x, int kernel, int stride, int padding) override;
  Value global_avg_pool(const Value& x) override;
  Value flatten(const Value& x) override;

  // Throws unless every listed point was visited.
  void finish() const;

 private:
  Value q(const Value& x, const std::string& site);
  std::size_t point(const std::string& site, bool relu);
  Value produced(const Value& y);

  GraphEmitter& inner_;
  Backend& backend_;
  std::vector<Point>& points_;
  Activations activations_;
  Silu silu_;
  bool creating_;
  std::size_t next_ = 0;
  int counter_ = 0;
  std::map<Value, Value> quantized_;        // value -> its quantized form
  std::map<Value, std::size_t> inherits_;   // value -> the point whose grid it is on
  std::set<Value> fresh_;                   // outputs of compute ops, not yet quantized
  std::set<Value> folded_;                  // pre-ReLU values whose ReLU went into the quantizer
};

}  // namespace convnets::quant
