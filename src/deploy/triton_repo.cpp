#include "deploy/triton_repo.h"

#include "core/error.h"

#include <sstream>

namespace convnets::deploy {
namespace {

// A protobuf text-format string literal.
std::string quoted(const std::string& s) {
  std::string out = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\') {
      out += '\\';
      out += c;
    } else if (c == '\n') {
      out += "\\n";
    } else {
      out += c;
    }
  }
  return out + '"';
}

bool valid_name(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.size() > 200) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

}  // namespace

void check_triton_settings(const TritonSettings& s) {
  if (!valid_name(s.name)) {
    throw Error("--model-name '" + s.name +
                "': expected letters, digits, '_', '-' or '.', not starting with '.' (it names the repository folder)");
  }
  if (s.max_batch_size < 1) {
    throw Error("--max-batch-size must be at least 1, got " + std::to_string(s.max_batch_size));
  }
  for (const auto b : s.preferred_batch_sizes) {
    if (b < 1 || b > s.max_batch_size) {
      throw Error("--preferred-batch-sizes: " + std::to_string(b) + " is outside 1.." +
                  std::to_string(s.max_batch_size) + " (--max-batch-size)");
    }
  }
  if (s.max_queue_delay_us < 0) {
    throw Error("--max-queue-delay-us must be 0 or more, got " + std::to_string(s.max_queue_delay_us));
  }
  if (s.instances < 1) throw Error("--engine-count-per-device must be at least 1, got " + std::to_string(s.instances));
  if (s.instance_kind != "gpu" && s.instance_kind != "cpu") {
    throw Error("--instance-kind '" + s.instance_kind + "': expected gpu | cpu");
  }
  if (s.accelerator != "none" && s.accelerator != "trt") {
    throw Error("--backend-accelerator '" + s.accelerator + "': expected none | trt");
  }
  if (s.trt_precision != "fp16" && s.trt_precision != "fp32") {
    throw Error("--trt-precision '" + s.trt_precision + "': expected fp16 | fp32");
  }
  if (s.accelerator == "trt" && s.instance_kind == "cpu") {
    throw Error("--backend-accelerator trt needs --instance-kind gpu: TensorRT runs on the GPU");
  }
}

std::string triton_config_text(const TritonSettings& s, const TritonGraph& g) {
  const char* type = g.fp16 ? "TYPE_FP16" : "TYPE_FP32";
  std::ostringstream o;
  o << "# A Triton Inference Server model configuration (model_config.proto), written by convnets export --format "
       "triton\n"
    << "# for " << g.arch << ". The graph is 1/model.onnx; input and output names are the graph's.\n"
    << "name: " << quoted(s.name) << "\n"
    << "backend: \"onnxruntime\"\n"
    << "max_batch_size: " << s.max_batch_size << "\n"
    << "input [\n  {\n    name: \"input\"\n    data_type: " << type << "\n    format: FORMAT_NCHW\n"
    << "    dims: [ 3, " << g.image_size << ", " << g.image_size << " ]\n  }\n]\n"
    << "output [\n  {\n    name: \"logits\"\n    data_type: " << type << "\n    dims: [ " << g.num_classes << " ]\n";
  if (g.labels) o << "    label_filename: \"labels.txt\"\n";
  o << "  }\n]\n"
    << "dynamic_batching {\n";
  if (!s.preferred_batch_sizes.empty()) {
    o << "  preferred_batch_size: [ ";
    for (std::size_t i = 0; i < s.preferred_batch_sizes.size(); ++i) {
      o << (i ? ", " : "") << s.preferred_batch_sizes[i];
    }
    o << " ]\n";
  }
  o << "  max_queue_delay_microseconds: " << s.max_queue_delay_us << "\n}\n"
    << "instance_group [\n  {\n    count: " << s.instances << "\n    kind: "
    << (s.instance_kind == "gpu" ? "KIND_GPU" : "KIND_CPU") << "\n  }\n]\n";
  if (s.accelerator == "trt") {
    o << "optimization {\n  execution_accelerators {\n    gpu_execution_accelerator: [\n      {\n"
      << "        name: \"tensorrt\"\n"
      << "        parameters { key: \"precision_mode\" value: " << (s.trt_precision == "fp16" ? "\"FP16\"" : "\"FP32\"")
      << " }\n"
      << "        parameters { key: \"max_workspace_size_bytes\" value: \"1073741824\" }\n"
      << "      }\n    ]\n  }\n}\n";
  }
  // A client that sends decoded images needs the model's eval transform; Triton passes parameters through.
  o << "parameters {\n  key: \"convnets.preprocessing\"\n  value: { string_value: " << quoted(g.preprocessing)
    << " }\n}\n";
  return o.str();
}

}  // namespace convnets::deploy
