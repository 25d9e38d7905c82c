#include "quant/qdq.h"

#include "core/error.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <limits>

namespace convnets::quant {

Activations parse_activations(const std::string& s, const std::string& flag) {
  if (s == "uint8") return Activations::UInt8;
  if (s == "int8") return Activations::Int8;
  throw Error(flag + " " + s + ": expected uint8 (ONNX Runtime, OpenVINO) or int8 (TensorRT)");
}

Method parse_method(const std::string& s, const std::string& flag) {
  if (s == "minmax") return Method::MinMax;
  if (s == "percentile") return Method::Percentile;
  if (s == "entropy") return Method::Entropy;
  throw Error(flag + " " + s + ": expected minmax, percentile or entropy");
}

Silu parse_silu(const std::string& s, const std::string& flag) {
  if (s == "ops") return Silu::Ops;
  if (s == "float") return Silu::Float;
  throw Error(flag + " " + s + ": expected ops (ONNX Runtime's integer SiLU) or float (fused into the conv: OpenVINO)");
}

std::string spelling(Silu s) { return s == Silu::Ops ? "ops" : "float"; }

std::string spelling(Activations a) { return a == Activations::UInt8 ? "uint8" : "int8"; }

std::string spelling(Method m) {
  switch (m) {
    case Method::MinMax: return "minmax";
    case Method::Percentile: return "percentile";
    case Method::Entropy: return "entropy";
  }
  return "?";
}

Params activation_params(const Point& p, Activations a) {
  Params r;
  if (a == Activations::Int8) {
    // Symmetric: TensorRT's Q/DQ have no zero point.
    const double amax = std::max(std::abs(p.lo), std::abs(p.hi));
    r.qmin = -128;
    r.qmax = 127;
    r.scale = amax > 0 ? amax / 127.0 : 1.0;
    return r;
  }
  // The range must hold 0 exactly (zero padding, ReLU's zeros): ONNX
  // Runtime's quantizer widens it the same way.
  const double lo = std::min(p.lo, 0.0), hi = std::max(p.hi, 0.0);
  r.qmin = 0;
  r.qmax = 255;
  r.scale = hi > lo ? (hi - lo) / 255.0 : 1.0;
  r.zero_point = std::clamp<std::int64_t>(std::llround(-lo / r.scale), 0, 255);
  return r;
}

std::int64_t weight_qmax(bool reduce_range) { return reduce_range ? 63 : 127; }

at::Tensor weight_scales(const at::Tensor& w, std::int64_t qmax) {
  const auto amax = w.detach().abs().reshape({w.size(0), -1}).amax(1).to(torch::kFloat);
  return torch::where(amax > 0, amax / static_cast<float>(qmax), torch::ones_like(amax));
}

nlohmann::json to_json(const Plan& plan) {
  nlohmann::json points = nlohmann::json::array();
  for (const auto& p : plan.points) points.push_back({{"site", p.site}, {"relu", p.relu}, {"lo", p.lo}, {"hi", p.hi}});
  return {{"activations", spelling(plan.activations)},
          {"method", spelling(plan.method)},
          {"reduce_range", plan.reduce_range},
          {"silu", spelling(plan.silu)},
          {"images", plan.images},
          {"points", points}};
}

Plan plan_from_json(const nlohmann::json& j, const std::string& where) {
  try {
    Plan plan;
    plan.activations = parse_activations(j.at("activations").get<std::string>(), where + ": activations");
    plan.method = parse_method(j.at("method").get<std::string>(), where + ": method");
    plan.reduce_range = j.at("reduce_range").get<bool>();
    if (j.contains("silu")) plan.silu = parse_silu(j.at("silu").get<std::string>(), where + ": silu");
    plan.images = j.at("images").get<std::int64_t>();
    for (const auto& e : j.at("points")) {
      Point p;
      p.site = e.at("site").get<std::string>();
      p.relu = e.at("relu").get<bool>();
      p.lo = e.at("lo").get<double>();
      p.hi = e.at("hi").get<double>();
      if (!std::isfinite(p.lo) || !std::isfinite(p.hi) || p.lo > p.hi) {
        throw Error(where + ": quantization point '" + p.site + "' has the range [" + std::to_string(p.lo) + ", " +
                    std::to_string(p.hi) + "]; expected finite lo <= hi");
      }
      plan.points.push_back(std::move(p));
    }
    return plan;
  } catch (const nlohmann::json::exception& e) {
    throw Error(where + ": malformed quantization ranges: " + e.what());
  }
}

// ---- calibration statistics

void Observer::add_minmax(const at::Tensor& x) {
  const auto [lo, hi] = torch::aminmax(x.detach().to(torch::kFloat));
  const double l = lo.item<double>(), h = hi.item<double>();
  min = seen ? std::min(min, l) : l;
  max = seen ? std::max(max, h) : h;
  seen = true;
}

void Observer::add_histogram(const at::Tensor& x) {
  if (hist.empty()) {
    hist.assign(kBins, 0.0);
    hist_max = std::max(std::abs(min), std::abs(max));
  }
  if (hist_max <= 0) {
    hist[0] += static_cast<double>(x.numel());
    return;
  }
  const auto h = torch::histc(x.detach().to(torch::kFloat).abs().flatten(), kBins, 0, static_cast<float>(hist_max))
                     .to(torch::kDouble)
                     .cpu()
                     .contiguous();
  const double* d = h.data_ptr<double>();
  for (int i = 0; i < kBins; ++i) hist[static_cast<std::size_t>(i)] += d[i];
}

double percentile_threshold(const std::vector<double>& hist, double hist_max, double percent) {
  double total = 0;
  for (double c : hist) total += c;
  if (total <= 0) return hist_max;
  const double want = total * percent / 100.0;
  double cum = 0;
  for (std::size_t i = 0; i < hist.size(); ++i) {
    cum += hist[i];
    if (cum >= want) return hist_max * static_cast<double>(i + 1) / static_cast<double>(hist.size());
  }
  return hist_max;
}

double entropy_threshold(const std::vector<double>& hist, double hist_max, int levels) {
  // pytorch-quantization's _compute_amax_entropy (TensorRT's algorithm): for
  // each candidate i >= levels, P is the histogram cut at i with the tail
  // added to its last bin; Q merges P's bins into `levels` groups, spreading
  // each group's count evenly over its non-empty bins.
  const std::size_t n = hist.size();
  const auto nl = static_cast<std::size_t>(levels);
  if (n <= nl) return hist_max;
  double total = 0;
  for (double c : hist) total += c;
  if (total <= 0) return hist_max;
  std::vector<double> tail(n + 1, 0.0);
  for (std::size_t i = n; i-- > 0;) tail[i] = tail[i + 1] + hist[i];
  double best = std::numeric_limits<double>::infinity();
  std::size_t best_i = n;
  std::vector<double> p, q;
  std::vector<double> sums(nl), counts(nl);
  for (std::size_t i = nl; i <= n; ++i) {
    p.assign(hist.begin(), hist.begin() + static_cast<std::ptrdiff_t>(i));
    p[i - 1] += tail[i];
    std::fill(sums.begin(), sums.end(), 0.0);
    std::fill(counts.begin(), counts.end(), 0.0);
    // Bin b of [0, i) falls in group floor(b * levels / i) (numpy.digitize over linspace(0, i, levels + 1)).
    for (std::size_t b = 0; b < i; ++b) {
      if (hist[b] == 0) continue;
      const std::size_t g = std::min(nl - 1, b * nl / i);
      sums[g] += hist[b];
      counts[g] += 1;
    }
    q.assign(i, 0.0);
    double qsum = 0;
    for (std::size_t b = 0; b < i; ++b) {
      if (hist[b] == 0) continue;
      const std::size_t g = std::min(nl - 1, b * nl / i);
      q[b] = sums[g] / counts[g];
      qsum += q[b];
    }
    double psum = 0;
    for (double v : p) psum += v;
    double kl = 0;
    bool infinite = false;
    for (std::size_t b = 0; b < i; ++b) {
      if (p[b] <= 0) continue;
      if (q[b] <= 0) {
        infinite = true;  // the tail landed in an empty last bin
        break;
      }
      const double pp = p[b] / psum, qq = q[b] / qsum;
      kl += pp * std::log(pp / qq);
    }
    if (infinite) continue;
    if (kl <= best) {  // `<=`: the last minimum, as pytorch-quantization takes it
      best = kl;
      best_i = i;
    }
  }
  return hist_max * static_cast<double>(best_i) / static_cast<double>(n);
}

void choose_range(Point& p, const Observer& o, Method method, Activations a) {
  p.lo = o.min;
  p.hi = o.max;
  if (method == Method::MinMax || o.hist.empty()) return;
  const bool unsigned_range = a == Activations::UInt8 && o.min >= 0;
  const double t = method == Method::Percentile ? percentile_threshold(o.hist, o.hist_max, kPercentile)
                                                : entropy_threshold(o.hist, o.hist_max, unsigned_range ? 256 : 128);
  p.lo = std::max(o.min, -t);
  p.hi = std::min(o.max, t);
}

// ---- placement

QdqEmitter::QdqEmitter(GraphEmitter& inner, Backend& backend, std::vector<Point>& points, Activations activations,
                       Silu silu, bool creating)
    : inner_(inner), backend_(backend), points_(points), activations_(activations), silu_(silu), creating_(creating) {}

std::size_t QdqEmitter::point(const std::string& site, bool relu) {
  if (next_ < points_.size()) {
    const auto& p = points_[next_];
    if (p.site != site || p.relu != relu) {
      throw Error("the quantization ranges do not fit this network: their tensor " + std::to_string(next_ + 1) +
                  " is '" + p.site + (p.relu ? "' (ReLU folded)" : "'") + ", this network's is '" + site + "'" +
                  (relu ? " (ReLU folded)" : ""),
                  "calibrate again for this network");
    }
  } else if (creating_) {
    points_.push_back(Point{site, relu, 0, 0});
  } else {
    throw Error("the quantization ranges do not fit this network: they cover " + std::to_string(points_.size()) +
                    " tensors, this network quantizes more (the next is '" + site + "')",
                "calibrate again for this network");
  }
  return next_++;
}

void QdqEmitter::finish() const {
  if (next_ != points_.size()) {
    throw Error("the quantization ranges do not fit this network: they cover " + std::to_string(points_.size()) +
                    " tensors, this network quantizes " + std::to_string(next_),
                "calibrate again for this network");
  }
}

GraphEmitter::Value QdqEmitter::q(const Value& x, const std::string& site) {
  if (const auto it = quantized_.find(x); it != quantized_.end()) return it->second;
  if (folded_.count(x)) {
    // Its ReLU already clipped it inside the quantizer: quantizing it again would be wrong.
    throw Error("quantization: the value before the ReLU at '" + site + "' is used again after it");
  }
  const auto inherited = inherits_.find(x);
  const std::size_t index = inherited != inherits_.end() ? inherited->second : point(site, false);
  const auto xq = backend_.quantize(x, index);
  quantized_[x] = xq;
  quantized_[xq] = xq;
  inherits_[xq] = index;
  fresh_.erase(x);
  return xq;
}

GraphEmitter::Value QdqEmitter::produced(const Value& y) {
  fresh_.insert(y);
  return y;
}

GraphEmitter::Value QdqEmitter::conv_bn(const Value& x, const models::Conv2dImpl& conv, const std::string& conv_name,
                                        const models::BatchNorm2dImpl& bn, const std::string& bn_name) {
  return produced(inner_.conv_bn(q(x, conv_name), conv, conv_name, bn, bn_name));
}

GraphEmitter::Value QdqEmitter::conv(const Value& x, const models::Conv2dImpl& c, const std::string& name) {
  return produced(inner_.conv(q(x, name), c, name));
}

GraphEmitter::Value QdqEmitter::linear(const Value& x, const models::LinearImpl& fc, const std::string& name) {
  return produced(inner_.linear(q(x, name), fc, name));
}

GraphEmitter::Value QdqEmitter::linear_1x1(const Value& x, const models::LinearImpl& fc, const std::string& name) {
  return produced(inner_.linear_1x1(q(x, name), fc, name));
}

GraphEmitter::Value QdqEmitter::relu(const Value& x) {
  const std::string site = "relu " + std::to_string(++counter_);
  if (activations_ == Activations::UInt8 && fresh_.count(x)) {
    // Q(max(x, 0)) with zero point 0 is Q(x) clipped at the bottom of the
    // range: the ReLU is the quantizer (ONNX Runtime's quantizer removes such
    // ReLUs the same way; its QLinearConv then runs conv + ReLU in one).
    const std::size_t index = point(site, true);
    const auto y = backend_.quantize(x, index);
    fresh_.erase(x);
    folded_.insert(x);
    quantized_[y] = y;
    inherits_[y] = index;
    return y;
  }
  const auto xq = q(x, site);
  const auto y = inner_.relu(xq);
  inherits_[y] = inherits_.at(xq);  // max(x, 0) of a grid value is on the grid
  return y;
}

GraphEmitter::Value QdqEmitter::silu(const Value& x) {
  // Float: the producing op's output (a conv's in every network here) goes
  // into the SiLU unquantized, and the SiLU's output is quantized by whatever
  // consumes it, as a ReLU would be folded. An input quantized already
  // (another consumer came first) keeps the ops form, in every interpreter alike.
  if (silu_ == Silu::Float && fresh_.count(x)) return produced(inner_.silu(x));
  return mul(x, sigmoid(x));
}

GraphEmitter::Value QdqEmitter::sigmoid(const Value& x) {
  return produced(inner_.sigmoid(q(x, "sigmoid " + std::to_string(++counter_))));
}

GraphEmitter::Value QdqEmitter::add(const Value& a, const Value& b) {
  const std::string site = "add " + std::to_string(++counter_);
  const auto qa = q(a, site);
  return produced(inner_.add(qa, q(b, site)));
}

GraphEmitter::Value QdqEmitter::mul(const Value& a, const Value& b) {
  const std::string site = "mul " + std::to_string(++counter_);
  const auto qa = q(a, site);
  return produced(inner_.mul(qa, q(b, site)));
}

GraphEmitter::Value QdqEmitter::max_pool(const Value& x, int kernel, int stride, int padding) {
  const auto xq = q(x, "max pool " + std::to_string(++counter_));
  const auto y = inner_.max_pool(xq, kernel, stride, padding);
  inherits_[y] = inherits_.at(xq);  // the max of grid values is one of them
  return y;
}

GraphEmitter::Value QdqEmitter::global_avg_pool(const Value& x) {
  return produced(inner_.global_avg_pool(q(x, "average pool " + std::to_string(++counter_))));
}

GraphEmitter::Value QdqEmitter::flatten(const Value& x) {
  const auto xq = q(x, "flatten " + std::to_string(++counter_));
  const auto y = inner_.flatten(xq);
  inherits_[y] = inherits_.at(xq);
  return y;
}

}  // namespace convnets::quant
