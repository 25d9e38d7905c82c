#include "export/onnx_export.h"

#include "core/error.h"
#include "io/atomic_file.h"
#include "models/graph.h"

#include <torch/torch.h>

#include <map>
#include <set>

#if CONVNETS_ONNX
#include <onnx/checker.h>
#include <onnx/onnx_pb.h>
#endif

namespace convnets {

#if CONVNETS_ONNX

namespace {

class OnnxEmitter : public GraphEmitter, public quant::Backend {
 public:
  OnnxEmitter(onnx::GraphProto& graph, const OnnxOptions& o) : graph_(graph), o_(o) {}

  // QuantizeLinear then DequantizeLinear with the point's scale and zero
  // point, one pair of initializers per point (so a runtime sees that the
  // pair around a max pool is the same quantization and drops it).
  Value quantize(const Value& x, std::size_t index) override {
    const auto& p = o_.int8->points.at(index);
    const auto q = quant::activation_params(p, o_.int8->activations);
    const std::string s = "q" + std::to_string(index) + ".scale", z = "q" + std::to_string(index) + ".zero_point";
    if (made_.insert(s).second) {
      raw_initializer(s, torch::full({}, q.scale, torch::kFloat), onnx::TensorProto::FLOAT);
      const bool u8 = o_.int8->activations == quant::Activations::UInt8;
      raw_initializer(z, torch::full({}, q.zero_point, u8 ? torch::kByte : torch::kChar),
                      u8 ? onnx::TensorProto::UINT8 : onnx::TensorProto::INT8);
    }
    const auto qv = node("QuantizeLinear", {x, s, z})->output(0);
    const auto dq = node("DequantizeLinear", {qv, s, z})->output(0);
    scale_of_[dq] = q.scale;
    return dq;
  }

  Value conv_bn(const Value& x, const models::Conv2dImpl& c, const std::string& conv_name,
                const models::BatchNorm2dImpl& bn, const std::string& bn_name) override {
    // A network folded in place (fold_batchnorm) has its BN in the conv already.
    if (bn.folded()) return conv(x, c, conv_name);
    if (!o_.fold_bn && !o_.int8) return batch_norm(conv(x, c, conv_name), bn, bn_name);
    const auto [w, b] = fold_conv_bn(c, bn);
    return conv_node(x, c, conv_name, w, b);
  }

  Value conv(const Value& x, const models::Conv2dImpl& c, const std::string& name) override {
    return conv_node(x, c, name, c.weight, c.bias);
  }

  Value linear(const Value& x, const models::LinearImpl& fc, const std::string& name) override {
    auto* n = node("Gemm", with_weights(x, name, fc.weight, fc.bias));
    attr_int(n, "transB", 1);
    return n->output(0);
  }

  Value linear_1x1(const Value& x, const models::LinearImpl& fc, const std::string& name) override {
    const auto w = fc.weight.view({fc.weight.size(0), fc.weight.size(1), 1, 1});
    auto* n = node("Conv", with_weights(x, name, w, fc.bias));
    attr_ints(n, "kernel_shape", {1, 1});
    return n->output(0);
  }

  Value relu(const Value& x) override { return node("Relu", {x})->output(0); }
  Value sigmoid(const Value& x) override { return node("Sigmoid", {x})->output(0); }
  // Opset 13 has no SiLU: x * sigmoid(x), which runtimes fuse back.
  Value silu(const Value& x) override { return mul(x, sigmoid(x)); }
  Value add(const Value& a, const Value& b) override { return node("Add", {a, b})->output(0); }
  Value mul(const Value& a, const Value& b) override { return node("Mul", {a, b})->output(0); }

  Value max_pool(const Value& x, int kernel, int stride, int padding) override {
    auto* n = node("MaxPool", {x});
    attr_ints(n, "kernel_shape", {kernel, kernel});
    attr_ints(n, "strides", {stride, stride});
    attr_ints(n, "pads", {padding, padding, padding, padding});
    return n->output(0);
  }
  Value global_avg_pool(const Value& x) override { return node("GlobalAveragePool", {x})->output(0); }
  Value flatten(const Value& x) override {
    auto* n = node("Flatten", {x});
    attr_int(n, "axis", 1);
    return n->output(0);
  }

  std::size_t nodes() const { return static_cast<std::size_t>(graph_.node_size()); }

 private:
  Value batch_norm(const Value& x, const models::BatchNorm2dImpl& bn, const std::string& name) {
    auto* n = node("BatchNormalization",
                   {x, initializer(name + ".weight", bn.weight), initializer(name + ".bias", bn.bias),
                    initializer(name + ".running_mean", bn.running_mean),
                    initializer(name + ".running_var", bn.running_var)});
    auto* a = n->add_attribute();
    a->set_name("epsilon");
    a->set_type(onnx::AttributeProto::FLOAT);
    a->set_f(static_cast<float>(bn.options.eps()));
    return n->output(0);
  }

  Value conv_node(const Value& x, const models::Conv2dImpl& c, const std::string& name, const at::Tensor& w,
                  const at::Tensor& b) {
    const auto& opt = c.options;
    const auto* pad = std::get_if<torch::ExpandingArray<2>>(&opt.padding());
    if (!pad) throw Error("export: layer " + name + " uses 'same'/'valid' padding by name, which is not exported");
    if (opt.padding_mode().index() != 0) throw Error("export: layer " + name + " pads other than with zeros");
    auto* n = node("Conv", with_weights(x, name, w, b));
    const auto& k = *opt.kernel_size();
    const auto& s = *opt.stride();
    const auto& d = *opt.dilation();
    const auto& p = **pad;
    attr_ints(n, "kernel_shape", {k[0], k[1]});
    attr_ints(n, "strides", {s[0], s[1]});
    attr_ints(n, "dilations", {d[0], d[1]});
    if (const auto* same = dynamic_cast<const models::Conv2dSameImpl*>(&c); same && same->dynamic()) {
      // TF "SAME" (timm's Conv2dSame): output ceil(in / stride), the odd pixel
      // padded at the end, which is what SAME_UPPER specifies, at any input size.
      auto* a = n->add_attribute();
      a->set_name("auto_pad");
      a->set_type(onnx::AttributeProto::STRING);
      a->set_s("SAME_UPPER");
    } else {
      attr_ints(n, "pads", {p[0], p[1], p[0], p[1]});
    }
    attr_int(n, "group", opt.groups());
    return n->output(0);
  }

  // {x, weight, bias (if defined)} as an op's inputs. INT8: the weight as
  // int8 with one scale per output channel (axis 0) behind a
  // DequantizeLinear; with uint8 activations the bias as int32 at scale
  // input scale x weight scale (ONNX Runtime's QDQ form, which lets it fuse
  // DQ -> Conv -> Q into QLinearConv), with int8 activations a float bias
  // (TensorRT quantizes no bias).
  std::vector<Value> with_weights(const Value& x, const std::string& name, const at::Tensor& w, const at::Tensor& b) {
    if (!o_.int8) {
      std::vector<Value> in{x, initializer(name + ".weight", w)};
      if (b.defined()) in.push_back(initializer(name + ".bias", b));
      return in;
    }
    const auto wf = w.detach().to(torch::kCPU, torch::kFloat).contiguous();
    const auto qmax = quant::weight_qmax(o_.int8->reduce_range);
    const auto ws = quant::weight_scales(wf, qmax);
    std::vector<std::int64_t> shape(static_cast<std::size_t>(wf.dim()), 1);
    shape[0] = -1;
    const auto per_row = ws.view(shape);
    const auto wq = (wf / per_row).round().clamp(-qmax, qmax).to(torch::kChar);
    raw_initializer(name + ".weight", wq, onnx::TensorProto::INT8);
    raw_initializer(name + ".weight_scale", ws, onnx::TensorProto::FLOAT);
    raw_initializer(name + ".weight_zero_point", torch::zeros({wf.size(0)}, torch::kChar), onnx::TensorProto::INT8);
    auto* dqw = node("DequantizeLinear", {name + ".weight", name + ".weight_scale", name + ".weight_zero_point"});
    attr_int(dqw, "axis", 0);
    std::vector<Value> in{x, dqw->output(0)};
    if (!b.defined()) return in;
    if (o_.int8->activations == quant::Activations::Int8) {
      in.push_back(initializer(name + ".bias", b));
      return in;
    }
    const auto sx = scale_of_.find(x);
    if (sx == scale_of_.end()) throw Error("export: the input of layer " + name + " is not quantized");
    const auto bs = (ws.to(torch::kDouble) * sx->second).to(torch::kFloat);
    const double lim = 2147483647.0;
    const auto bq = (b.detach().to(torch::kCPU, torch::kDouble) / bs.to(torch::kDouble)).round().clamp(-lim, lim).to(torch::kInt);
    raw_initializer(name + ".bias", bq, onnx::TensorProto::INT32);
    raw_initializer(name + ".bias_scale", bs, onnx::TensorProto::FLOAT);
    raw_initializer(name + ".bias_zero_point", torch::zeros({wf.size(0)}, torch::kInt), onnx::TensorProto::INT32);
    auto* dqb = node("DequantizeLinear", {name + ".bias", name + ".bias_scale", name + ".bias_zero_point"});
    attr_int(dqb, "axis", 0);
    in.push_back(dqb->output(0));
    return in;
  }

  // A tensor stored as it is (its dtype must be `type`'s).
  void raw_initializer(const std::string& name, const at::Tensor& value, int type) {
    const auto t = value.detach().to(torch::kCPU).contiguous();
    auto* init = graph_.add_initializer();
    init->set_name(name);
    init->set_data_type(type);
    for (auto s : t.sizes()) init->add_dims(s);
    init->set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
  }

  Value initializer(const std::string& name, const at::Tensor& value) {
    auto t = value.detach().to(torch::kCPU).contiguous();  // NCHW order whatever the memory format
    t = t.to(o_.fp16 ? torch::kHalf : torch::kFloat).contiguous();
    auto* init = graph_.add_initializer();
    init->set_name(name);
    init->set_data_type(o_.fp16 ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT);
    for (auto s : t.sizes()) init->add_dims(s);
    init->set_raw_data(std::string(static_cast<const char*>(t.data_ptr()), t.nbytes()));
    return name;
  }

  onnx::NodeProto* node(const std::string& op, const std::vector<Value>& inputs) {
    auto* n = graph_.add_node();
    n->set_op_type(op);
    n->set_name(op + "_" + std::to_string(graph_.node_size()));
    for (const auto& i : inputs) n->add_input(i);
    n->add_output("t" + std::to_string(graph_.node_size()));
    return n;
  }

  static void attr_int(onnx::NodeProto* n, const std::string& name, std::int64_t v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INT);
    a->set_i(v);
  }
  static void attr_ints(onnx::NodeProto* n, const std::string& name, const std::vector<std::int64_t>& v) {
    auto* a = n->add_attribute();
    a->set_name(name);
    a->set_type(onnx::AttributeProto::INTS);
    for (auto x : v) a->add_ints(x);
  }

  onnx::GraphProto& graph_;
  const OnnxOptions& o_;
  std::set<std::string> made_;             // quantization initializers already written
  std::map<Value, double> scale_of_;       // DequantizeLinear outputs -> their scale
};

void set_shape(onnx::ValueInfoProto* v, const std::string& name, bool fp16, bool dynamic, std::int64_t batch,
               const std::vector<std::int64_t>& rest) {
  v->set_name(name);
  auto* t = v->mutable_type()->mutable_tensor_type();
  t->set_elem_type(fp16 ? onnx::TensorProto::FLOAT16 : onnx::TensorProto::FLOAT);
  auto* shape = t->mutable_shape();
  auto* d0 = shape->add_dim();
  if (dynamic) {
    d0->set_dim_param("batch");
  } else {
    d0->set_dim_value(batch);
  }
  for (auto r : rest) shape->add_dim()->set_dim_value(r);
}

}  // namespace

bool onnx_export_available() { return true; }

std::size_t export_onnx(NetworkImpl& model, const OnnxOptions& o, const std::string& path) {
  std::size_t nodes = 0;
  write_file_atomically(path, onnx_model_bytes(model, o, &nodes));
  return nodes;
}

std::string onnx_model_bytes(NetworkImpl& model, const OnnxOptions& o, std::size_t* nodes) {
  if (o.opset < 13) throw Error("--opset " + std::to_string(o.opset) + ": the exporter writes opset 13 or newer");
  onnx::ModelProto m;
  m.set_ir_version(onnx::IR_VERSION);
  m.set_producer_name("convnets");
  m.set_model_version(1);
  auto* opset = m.add_opset_import();
  opset->set_domain("");
  opset->set_version(o.opset);
  for (const auto& [k, v] : o.metadata) {
    auto* p = m.add_metadata_props();
    p->set_key(k);
    p->set_value(v);
  }
  auto* graph = m.mutable_graph();
  graph->set_name("convnets");
  if (o.int8 && o.fp16) throw Error("export: --int8 and --dtype fp16 exclude each other (INT8 graphs take fp32 input)");
  model.eval();
  OnnxEmitter emitter(*graph, o);
  std::string logits;
  if (o.int8) {
    auto points = o.int8->points;
    quant::QdqEmitter qdq(emitter, emitter, points, o.int8->activations, o.int8->silu, /*creating=*/false);
    logits = model.emit(qdq, "input");
    qdq.finish();
  } else {
    logits = model.emit(emitter, "input");
  }
  set_shape(graph->add_input(), "input", o.fp16, o.dynamic_batch, o.batch, {3, o.image_size, o.image_size});
  // The graph's last node writes the logits under the output's name.
  auto* last = graph->mutable_node(graph->node_size() - 1);
  if (last->output(0) != logits) throw Error("export: the network's output is not its last op");
  last->set_output(0, "logits");
  set_shape(graph->add_output(), "logits", o.fp16, o.dynamic_batch, o.batch, {o.num_classes});
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    throw Error("export: ONNX's checker rejected the graph: " + std::string(e.what()));
  }
  std::string bytes;
  if (!m.SerializeToString(&bytes)) throw Error("export: could not serialise the ONNX model");
  if (nodes) *nodes = emitter.nodes();
  return bytes;
}

OnnxInfo read_onnx_info(const std::string& bytes, const std::string& name) {
  onnx::ModelProto m;
  if (!m.ParseFromString(bytes) || !m.has_graph()) throw Error(name + ": not an ONNX model (the protobuf does not parse)");
  OnnxInfo info;
  for (const auto& p : m.metadata_props()) info.metadata[p.key()] = p.value();
  // The first input that no initializer feeds is the image.
  std::set<std::string> weights;
  for (const auto& i : m.graph().initializer()) weights.insert(i.name());
  for (const auto& in : m.graph().input()) {
    if (weights.count(in.name())) continue;
    const auto& shape = in.type().tensor_type().shape();
    if (shape.dim_size() == 4 && shape.dim(2).has_dim_value() && shape.dim(3).has_dim_value() &&
        shape.dim(2).dim_value() == shape.dim(3).dim_value()) {
      info.input_size = shape.dim(2).dim_value();
    }
    break;
  }
  return info;
}

#else

bool onnx_export_available() { return false; }

OnnxInfo read_onnx_info(const std::string&, const std::string& name) {
  throw Error(name + ": this convnets was built without ONNX (libonnx-dev was not found at configure time)");
}

std::size_t export_onnx(NetworkImpl& model, const OnnxOptions& o, const std::string&) {
  return onnx_model_bytes(model, o, nullptr).size();
}

std::string onnx_model_bytes(NetworkImpl&, const OnnxOptions&, std::size_t*) {
  throw Error("this convnets was built without ONNX (libonnx-dev was not found at configure time)",
              "install libonnx-dev and libprotobuf-dev (scripts/setup.sh does) and rebuild");
}

#endif

}  // namespace convnets
