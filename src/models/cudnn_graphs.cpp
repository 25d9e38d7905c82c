#include "models/cudnn_graphs.h"

#include "core/error.h"

#include <ATen/cudnn/Handle.h>
#include <ATen/ops/empty.h>
#include <c10/cuda/CUDAGuard.h>

// The frontend's JSON serialisation is not used here, and its bundled JSON header alone is 1 MB to parse.
#define CUDNN_FRONTEND_SKIP_JSON_LIB
#include <cudnn_frontend.h>

#include <c10/cuda/CUDAGraphsC10Utils.h>

#include <atomic>
#include <map>
#include <set>
#include <memory>
#include <mutex>
#include <sstream>
#include <unordered_map>

namespace convnets::models::norm_conv {
namespace {

namespace fe = cudnn_frontend;
using Graph = fe::graph::Graph;
using Tensor = std::shared_ptr<fe::graph::Tensor_attributes>;
using TA = fe::graph::Tensor_attributes;

enum class Kind { ConvGenstats, SbrConvGenstats, DgradDreluDbn, SbrWgrad, ConvBiasAct, DgradAdd };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::ConvGenstats: return "conv+genstats";
    case Kind::SbrConvGenstats: return "scale-bias-relu+conv+genstats";
    case Kind::DgradDreluDbn: return "dgrad+drelu+dbn_weight";
    case Kind::ConvBiasAct: return "conv+bias+act";
    case Kind::DgradAdd: return "dgrad+add";
    default: return "scale-bias-relu+wgrad";
  }
}

// The variant pack's keys: each graph names its tensors by these uids.
enum Uid : std::int64_t {
  kX = 1, kW, kScale, kBias, kY, kSum, kSumSq,               // forward
  kDy, kMean, kInvstd, kGamma, kBeta, kDz, kDsumXhat, kDsum,  // dgrad + drelu + dbn
  kEqScaleDy, kEqScaleX, kEqBias,                            // dbn_weight's coefficients (unused here)
  kDw,                                                       // wgrad
  kConvBias, kResidual,                                      // inference's conv+bias+act
  kDx,                                                       // dgrad+add (kDy, kW, kResidual: the addend)
};

fe::DataType_t io_type(at::ScalarType t) {
  return t == at::kBFloat16 ? fe::DataType_t::BFLOAT16 : fe::DataType_t::HALF;
}

// An activation [n, c, h, w] in NHWC memory; a filter [k, c, r, s] in KRSC memory; a per-channel [1, c, 1, 1].
Tensor nhwc(Graph& g, const char* name, Uid uid, std::int64_t n, std::int64_t c, std::int64_t h, std::int64_t w) {
  return g.tensor(TA().set_name(name).set_uid(uid).set_dim({n, c, h, w}).set_stride({c * h * w, 1, c * w, c}));
}
Tensor per_channel(Graph& g, const char* name, Uid uid, std::int64_t c, fe::DataType_t type) {
  return g.tensor(TA().set_name(name).set_uid(uid).set_dim({1, c, 1, 1}).set_stride({c, 1, c, c}).set_data_type(type));
}
void as_output(const Tensor& t, Uid uid, std::vector<std::int64_t> dim, std::vector<std::int64_t> stride,
               std::optional<fe::DataType_t> type = std::nullopt) {
  t->set_output(true).set_uid(uid).set_dim(std::move(dim)).set_stride(std::move(stride));
  if (type) t->set_data_type(*type);
}

// relu(x * scale + bias): the previous BN and its ReLU, applied as the convolution reads its input.
Tensor prologue(Graph& g, const Tensor& x, const ConvGeometry& c) {
  const auto type = io_type(c.dtype);
  auto s = per_channel(g, "scale", kScale, c.c, type), b = per_channel(g, "bias", kBias, c.c, type);
  auto t = g.pointwise(x, s, fe::graph::Pointwise_attributes().set_name("scale").set_mode(fe::PointwiseMode_t::MUL));
  t = g.pointwise(t, b, fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
  return g.pointwise(t, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
}

// What follows inference's conv+bias (Kind::ConvBiasAct); the training graphs have none.
struct Epilogue {
  Activation act = Activation::None;
  bool residual = false;
};

std::shared_ptr<Graph> describe(Kind kind, const ConvGeometry& c, const Epilogue& e = {}) {
  auto g = std::make_shared<Graph>();
  const auto io = io_type(c.dtype);
  // The wgrad's prologue hands the convolution its input in the activations' type (cuDNN's scale-bias-relu-wgrad
  // pattern); the other graphs keep their intermediates in fp32.
  g->set_io_data_type(io)
      .set_intermediate_data_type(kind == Kind::SbrWgrad ? io : fe::DataType_t::FLOAT)
      .set_compute_data_type(fe::DataType_t::FLOAT);
  const std::int64_t oh = c.out_h(), ow = c.out_w();
  auto filters = g->tensor(TA().set_name("w").set_uid(kW).set_dim({c.k, c.c, c.r, c.s})
                               .set_stride({c.c * c.r * c.s, 1, c.c * c.s, c.c}));
  const std::vector<std::int64_t> pad{c.pad, c.pad}, stride{c.stride, c.stride}, dilation{1, 1};
  if (kind == Kind::ConvGenstats || kind == Kind::SbrConvGenstats) {
    auto x = nhwc(*g, "x", kX, c.n, c.c, c.h, c.w);
    auto in = kind == Kind::SbrConvGenstats ? prologue(*g, x, c) : x;
    auto y = g->conv_fprop(in, filters, fe::graph::Conv_fprop_attributes().set_name("conv").set_padding(pad)
                                            .set_stride(stride).set_dilation(dilation));
    as_output(y, kY, {c.n, c.k, oh, ow}, {c.k * oh * ow, 1, c.k * ow, c.k});
    auto [sum, sumsq] = g->genstats(y, fe::graph::Genstats_attributes().set_name("genstats"));
    as_output(sum, kSum, {1, c.k, 1, 1}, {c.k, 1, c.k, c.k}, fe::DataType_t::FLOAT);
    as_output(sumsq, kSumSq, {1, c.k, 1, 1}, {c.k, 1, c.k, c.k}, fe::DataType_t::FLOAT);
  } else if (kind == Kind::DgradDreluDbn) {
    auto dy = nhwc(*g, "dy", kDy, c.n, c.k, oh, ow);
    auto dgrad = g->conv_dgrad(dy, filters, fe::graph::Conv_dgrad_attributes().set_name("dgrad").set_padding(pad)
                                                .set_stride(stride).set_dilation(dilation));
    dgrad->set_dim({c.n, c.c, c.h, c.w}).set_stride({c.c * c.h * c.w, 1, c.c * c.w, c.c});
    // The ReLU's mask, recomputed from the BN's input as bn(y) = (y - mean) * invstd * gamma + beta.
    auto y = nhwc(*g, "y", kX, c.n, c.c, c.h, c.w);
    const auto f32 = fe::DataType_t::FLOAT;
    auto mean = per_channel(*g, "mean", kMean, c.c, f32), invstd = per_channel(*g, "invstd", kInvstd, c.c, f32);
    auto gamma = per_channel(*g, "gamma", kGamma, c.c, f32), beta = per_channel(*g, "beta", kBeta, c.c, f32);
    auto bn = g->pointwise(y, mean, fe::graph::Pointwise_attributes().set_name("sub").set_mode(fe::PointwiseMode_t::SUB));
    bn = g->pointwise(bn, invstd, fe::graph::Pointwise_attributes().set_name("norm").set_mode(fe::PointwiseMode_t::MUL));
    bn = g->pointwise(bn, gamma, fe::graph::Pointwise_attributes().set_name("gamma").set_mode(fe::PointwiseMode_t::MUL));
    bn = g->pointwise(bn, beta, fe::graph::Pointwise_attributes().set_name("beta").set_mode(fe::PointwiseMode_t::ADD));
    auto dz = g->pointwise(dgrad, bn, fe::graph::Pointwise_attributes().set_name("drelu").set_mode(fe::PointwiseMode_t::RELU_BWD));
    as_output(dz, kDz, {c.n, c.c, c.h, c.w}, {c.c * c.h * c.w, 1, c.c * c.w, c.c}, io);
    auto [dscale, dbias, eq_dy, eq_x, eq_bias] =
        g->dbn_weight(dz, y, mean, invstd, gamma, fe::graph::DBN_weight_attributes().set_name("dbn_weight"));
    const std::vector<std::int64_t> pc{1, c.c, 1, 1}, pcs{c.c, 1, c.c, c.c};
    as_output(dscale, kDsumXhat, pc, pcs, f32);
    as_output(dbias, kDsum, pc, pcs, f32);
    as_output(eq_dy, kEqScaleDy, pc, pcs, f32);
    as_output(eq_x, kEqScaleX, pc, pcs, f32);
    as_output(eq_bias, kEqBias, pc, pcs, f32);
  } else if (kind == Kind::DgradAdd) {
    // The block input's gradient: the convolution's dgrad, with the other consumer's gradient added in fp32 before
    // the one write.
    auto dy = nhwc(*g, "dy", kDy, c.n, c.k, oh, ow);
    auto dgrad = g->conv_dgrad(dy, filters, fe::graph::Conv_dgrad_attributes().set_name("dgrad").set_padding(pad)
                                                .set_stride(stride).set_dilation(dilation));
    dgrad->set_dim({c.n, c.c, c.h, c.w}).set_stride({c.c * c.h * c.w, 1, c.c * c.w, c.c});
    auto dx = g->pointwise(dgrad, nhwc(*g, "addend", kResidual, c.n, c.c, c.h, c.w),
                           fe::graph::Pointwise_attributes().set_name("add").set_mode(fe::PointwiseMode_t::ADD));
    as_output(dx, kDx, {c.n, c.c, c.h, c.w}, {c.c * c.h * c.w, 1, c.c * c.w, c.c}, io);
  } else if (kind == Kind::ConvBiasAct) {
    auto x = nhwc(*g, "x", kX, c.n, c.c, c.h, c.w);
    auto y = g->conv_fprop(x, filters, fe::graph::Conv_fprop_attributes().set_name("conv").set_padding(pad)
                                           .set_stride(stride).set_dilation(dilation));
    if (e.residual) {
      y = g->pointwise(y, nhwc(*g, "residual", kResidual, c.n, c.k, oh, ow),
                       fe::graph::Pointwise_attributes().set_name("add").set_mode(fe::PointwiseMode_t::ADD));
    }
    y = g->pointwise(y, per_channel(*g, "conv_bias", kConvBias, c.k, io),
                     fe::graph::Pointwise_attributes().set_name("bias").set_mode(fe::PointwiseMode_t::ADD));
    if (e.act == Activation::ReLU) {
      y = g->pointwise(y, fe::graph::Pointwise_attributes().set_name("relu").set_mode(fe::PointwiseMode_t::RELU_FWD));
    } else if (e.act == Activation::SiLU) {
      y = g->pointwise(y, fe::graph::Pointwise_attributes().set_name("silu").set_mode(fe::PointwiseMode_t::SWISH_FWD)
                              .set_swish_beta(1.f));
    }
    as_output(y, kY, {c.n, c.k, oh, ow}, {c.k * oh * ow, 1, c.k * ow, c.k}, io);
  } else {
    auto x = nhwc(*g, "x", kX, c.n, c.c, c.h, c.w);
    auto dy = nhwc(*g, "dy", kDy, c.n, c.k, oh, ow);
    auto dw = g->conv_wgrad(dy, prologue(*g, x, c), fe::graph::Conv_wgrad_attributes().set_name("wgrad")
                                                        .set_padding(pad).set_stride(stride).set_dilation(dilation));
    as_output(dw, kDw, {c.k, c.c, c.r, c.s}, {c.c * c.r * c.s, 1, c.c * c.s, c.c}, io);
  }
  return g;
}

std::string key(Kind kind, const ConvGeometry& c, const void* handle, const Epilogue& e = {}) {
  std::ostringstream s;
  s << static_cast<int>(kind) << '/' << static_cast<int>(e.act) << '/' << e.residual << '|' << c.n << ',' << c.c
    << ',' << c.h << ',' << c.w << '|' << c.k << ',' << c.r << ',' << c.s << '|' << c.stride << ',' << c.pad << '|' << static_cast<int>(c.dtype) << '|' << handle;
  return s.str();
}

struct Plan {
  std::shared_ptr<Graph> graph;  // null: cuDNN had no engine (then `failure` says what it said)
  std::int64_t workspace = 0;
  std::string failure;
};

std::mutex cache_mutex;
// Never destroyed: cuDNN's plans must not be torn down after cuDNN and the CUDA context at the process's exit.
auto& cache = *new std::map<std::string, std::shared_ptr<const Plan>>;

// The plan of `kind` for `c` on this thread's cuDNN handle (PyTorch keeps one per thread and device, and a plan
// belongs to the handle it was built with: the forward's graphs are built on the training thread, the backward's
// on autograd's device thread, each at its first use in the step's eager warm-up): built on first use (cuDNN's
// heuristics, then its fallback list), cached after, a failure too (asked once). Inside a CUDA graph capture
// nothing is built: an unseen graph there is an absent one.
std::shared_ptr<const Plan> lookup(Kind kind, const ConvGeometry& c, const Epilogue& e = {}) {
  auto handle = at::native::getCudnnHandle();
  const auto k = key(kind, c, handle, e);
  std::lock_guard<std::mutex> lock(cache_mutex);
  if (auto it = cache.find(k); it != cache.end()) return it->second;
  if (c10::cuda::currentStreamCaptureStatusMayInitCtx() != c10::cuda::CaptureStatus::None) {
    auto absent = std::make_shared<Plan>();
    absent->failure = std::string("the ") + kind_name(kind) + " graph of " + c.str() + " was not built before the capture";
    return absent;
  }
  auto p = std::make_shared<Plan>();
  p->graph = describe(kind, c, e);
  auto built = p->graph->build(handle, {fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
  if (built.is_good()) {
    auto ws = p->graph->get_workspace_size(p->workspace);
    if (!ws.is_good()) built = ws;
  }
  if (!built.is_good()) {
    p->failure = std::string("cuDNN has no engine for the ") + kind_name(kind) + " graph of " + c.str() + ": " +
                 built.get_message();
    p->graph.reset();
  }
  cache.emplace(k, p);
  return p;
}

// The same, where the graph must run: a failure is an Error naming the graph and the shape.
std::shared_ptr<const Plan> plan(Kind kind, const ConvGeometry& c, const Epilogue& e = {}) {
  auto p = lookup(kind, c, e);
  if (!p->graph) {
    throw Error(p->failure, kind == Kind::ConvBiasAct ? "run with --no-fused-conv to keep the convolutions unfused"
                                                      : "train with --fusion bn to keep these blocks on the fused "
                                                        "BN+ReLU path");
  }
  return p;
}

void execute(Kind kind, const ConvGeometry& c, std::unordered_map<std::int64_t, void*>& pack, const at::Tensor& like,
             const Epilogue& e = {}) {
  const c10::cuda::CUDAGuard guard(like.device());
  const auto p = plan(kind, c, e);
  // From the caching allocator on the current stream: safe inside a CUDA graph capture.
  const auto workspace = at::empty({std::max<std::int64_t>(p->workspace, 1)}, like.options().dtype(at::kByte));
  auto status = p->graph->execute(at::native::getCudnnHandle(), pack, workspace.data_ptr());
  if (!status.is_good()) {
    throw Error(std::string("cuDNN: the ") + kind_name(kind) + " graph of " + c.str() + " failed: " + status.get_message());
  }
}

void check_layout(const at::Tensor& t, const char* what, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == dtype && t.is_contiguous(at::MemoryFormat::ChannelsLast), "cudnn_graphs: ",
              what, " must be a channels-last CUDA tensor of ", dtype, ", got ", t.scalar_type(), " ", t.sizes());
}

void check_vector(const at::Tensor& t, const char* what, std::int64_t n, at::ScalarType dtype) {
  TORCH_CHECK(t.is_cuda() && t.scalar_type() == dtype && t.is_contiguous() && t.numel() == n, "cudnn_graphs: ", what,
              " must be a contiguous CUDA [", n, "] of ", dtype, ", got ", t.scalar_type(), " ", t.sizes());
}

}  // namespace

std::string ConvGeometry::str() const {
  std::ostringstream o;
  o << r << "x" << s << "/" << stride << " " << c << "->" << k << " at " << h << "x" << w << ", batch " << n << ", "
    << (dtype == at::kBFloat16 ? "bf16" : "fp16");
  return o.str();
}

void conv_genstats(const ConvGeometry& g, bool with_prologue, const at::Tensor& x, const at::Tensor& w,
                   const at::Tensor& scale, const at::Tensor& bias, const at::Tensor& y, const at::Tensor& sum,
                   const at::Tensor& sumsq) {
  check_layout(x, "x", g.dtype);
  check_layout(w, "w", g.dtype);
  check_layout(y, "y", g.dtype);
  check_vector(sum, "sum", g.k, at::kFloat);
  check_vector(sumsq, "sumsq", g.k, at::kFloat);
  std::unordered_map<std::int64_t, void*> pack{{kX, x.data_ptr()}, {kW, w.data_ptr()}, {kY, y.data_ptr()},
                                               {kSum, sum.data_ptr()}, {kSumSq, sumsq.data_ptr()}};
  if (with_prologue) {
    check_vector(scale, "scale", g.c, g.dtype);
    check_vector(bias, "bias", g.c, g.dtype);
    pack.emplace(kScale, scale.data_ptr());
    pack.emplace(kBias, bias.data_ptr());
  }
  execute(with_prologue ? Kind::SbrConvGenstats : Kind::ConvGenstats, g, pack, x);
}

void dgrad_drelu_dbn(const ConvGeometry& g, const at::Tensor& dy, const at::Tensor& w, const at::Tensor& y,
                     const at::Tensor& mean, const at::Tensor& invstd, const at::Tensor& gamma, const at::Tensor& beta,
                     const at::Tensor& dz, const at::Tensor& dsum, const at::Tensor& dsum_xhat) {
  check_layout(dy, "dy", g.dtype);
  check_layout(w, "w", g.dtype);
  check_layout(y, "y", g.dtype);
  check_layout(dz, "dz", g.dtype);
  for (const auto* t : {&mean, &invstd, &gamma, &beta, &dsum, &dsum_xhat}) check_vector(*t, "a per-channel tensor", g.c, at::kFloat);
  // dbn_weight's own coefficients for dx, which the block computes from dsum and dsum_xhat itself.
  const auto coefficients = at::empty({3, g.c}, mean.options());
  std::unordered_map<std::int64_t, void*> pack{
      {kDy, dy.data_ptr()},        {kW, w.data_ptr()},         {kX, y.data_ptr()},
      {kMean, mean.data_ptr()},    {kInvstd, invstd.data_ptr()}, {kGamma, gamma.data_ptr()},
      {kBeta, beta.data_ptr()},    {kDz, dz.data_ptr()},       {kDsum, dsum.data_ptr()},
      {kDsumXhat, dsum_xhat.data_ptr()}, {kEqScaleDy, coefficients[0].data_ptr()},
      {kEqScaleX, coefficients[1].data_ptr()}, {kEqBias, coefficients[2].data_ptr()}};
  execute(Kind::DgradDreluDbn, g, pack, dy);
}

void wgrad_prologue(const ConvGeometry& g, const at::Tensor& dy, const at::Tensor& x, const at::Tensor& scale,
                    const at::Tensor& bias, const at::Tensor& dw) {
  check_layout(dy, "dy", g.dtype);
  check_layout(x, "x", g.dtype);
  check_layout(dw, "dw", g.dtype);
  check_vector(scale, "scale", g.c, g.dtype);
  check_vector(bias, "bias", g.c, g.dtype);
  std::unordered_map<std::int64_t, void*> pack{{kDy, dy.data_ptr()}, {kX, x.data_ptr()}, {kScale, scale.data_ptr()},
                                               {kBias, bias.data_ptr()}, {kDw, dw.data_ptr()}};
  execute(Kind::SbrWgrad, g, pack, dy);
}

void prepare(const ConvGeometry& g, bool with_prologue) {
  // The backward's graphs are built where they run, on autograd's thread and its handle, at the first backward.
  plan(with_prologue ? Kind::SbrConvGenstats : Kind::ConvGenstats, g);
}

std::atomic<bool> fused_backward{true};

bool fused_dgrad(const ConvGeometry& g) { return fused_backward && lookup(Kind::DgradDreluDbn, g)->graph != nullptr; }
bool fused_wgrad(const ConvGeometry& g) { return fused_backward && lookup(Kind::SbrWgrad, g)->graph != nullptr; }
void set_fused_backward(bool on) { fused_backward = on; }

std::string backward_fallbacks() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  std::set<std::string> seen;  // one line per graph and shape, whichever handles asked
  std::string out;
  for (const auto& [k, p] : cache) {
    if (!p->graph && seen.insert(p->failure).second) out += (out.empty() ? "" : "; ") + p->failure;
  }
  return out;
}

std::string check_graphs(const ConvGeometry& g) {
  std::string failed;
  for (const Kind kind : {Kind::ConvGenstats, Kind::SbrConvGenstats, Kind::DgradDreluDbn, Kind::SbrWgrad}) {
    auto graph = describe(kind, g);
    auto status = graph->validate();
    // Without a handle: cuDNN 9.8 and later lower a graph to its operation graph on the CPU alone.
    if (status.is_good()) status = graph->build_operation_graph(nullptr);
    if (!status.is_good()) failed += std::string(failed.empty() ? "" : "; ") + kind_name(kind) + ": " + status.get_message();
  }
  return failed;
}

namespace {

std::string plan_deviceless(const ConvGeometry& g, const std::vector<Kind>& kinds, const Epilogue& e,
                            const std::string& device_json, int sm_version) {
  auto device = std::make_shared<fe::DeviceProperties>();
  auto status = device->deserialize(std::vector<std::uint8_t>(device_json.begin(), device_json.end()));
  if (!status.is_good()) return "the device description: " + status.get_message();
  std::string failed;
  for (const Kind kind : kinds) {
    auto graph = describe(kind, g, e);
    // Both said: without them the frontend asks the CUDA driver, which a machine without a GPU has not.
    graph->set_device_properties(device).set_sm_version(sm_version);
    status = graph->validate();
    if (status.is_good()) status = graph->build_operation_graph();
    if (status.is_good()) status = graph->create_execution_plans({fe::HeurMode_t::A, fe::HeurMode_t::FALLBACK});
    if (status.is_good()) status = graph->check_support();
    if (status.is_good()) status = graph->build_plans();
    if (!status.is_good()) failed += std::string(failed.empty() ? "" : "; ") + kind_name(kind) + ": " + status.get_message();
  }
  return failed;
}

}  // namespace

std::string check_plans(const ConvGeometry& g, bool with_prologue, const std::string& device_json, int sm_version) {
  std::vector<Kind> kinds{Kind::ConvGenstats};
  if (with_prologue) kinds = {Kind::SbrConvGenstats, Kind::DgradDreluDbn, Kind::SbrWgrad};
  return plan_deviceless(g, kinds, {}, device_json, sm_version);
}

std::string conv_bias_act_refusal(const ConvAct& c) {
  const auto p = lookup(Kind::ConvBiasAct, c.g, {c.act, c.residual});
  return p->graph ? "" : p->failure;
}

void conv_bias_act(const ConvAct& c, const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias,
                   const at::Tensor& residual, const at::Tensor& y) {
  check_layout(x, "x", c.g.dtype);
  check_layout(w, "w", c.g.dtype);
  check_layout(y, "y", c.g.dtype);
  check_vector(bias, "bias", c.g.k, c.g.dtype);
  std::unordered_map<std::int64_t, void*> pack{
      {kX, x.data_ptr()}, {kW, w.data_ptr()}, {kConvBias, bias.data_ptr()}, {kY, y.data_ptr()}};
  if (c.residual) {
    check_layout(residual, "residual", c.g.dtype);
    pack.emplace(kResidual, residual.data_ptr());
  }
  execute(Kind::ConvBiasAct, c.g, pack, x, {c.act, c.residual});
}

std::string check_conv_act_plans(const ConvAct& c, const std::string& device_json, int sm_version) {
  return plan_deviceless(c.g, {Kind::ConvBiasAct}, {c.act, c.residual}, device_json, sm_version);
}

std::string dgrad_add_refusal(const ConvGeometry& g) {
  const auto p = lookup(Kind::DgradAdd, g);
  return p->graph ? "" : p->failure;
}

void dgrad_add(const ConvGeometry& g, const at::Tensor& dy, const at::Tensor& w, const at::Tensor& addend,
               const at::Tensor& dx) {
  check_layout(dy, "dy", g.dtype);
  check_layout(w, "w", g.dtype);
  check_layout(addend, "addend", g.dtype);
  check_layout(dx, "dx", g.dtype);
  std::unordered_map<std::int64_t, void*> pack{
      {kDy, dy.data_ptr()}, {kW, w.data_ptr()}, {kResidual, addend.data_ptr()}, {kDx, dx.data_ptr()}};
  execute(Kind::DgradAdd, g, pack, dy);
}

std::string check_dgrad_add_plans(const ConvGeometry& g, const std::string& device_json, int sm_version) {
  return plan_deviceless(g, {Kind::DgradAdd}, {}, device_json, sm_version);
}

std::size_t cached_plans() {
  std::lock_guard<std::mutex> lock(cache_mutex);
  return cache.size();
}

}  // namespace convnets::models::norm_conv
