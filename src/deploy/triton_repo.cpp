#include "deploy/triton_repo.h"

#include "core/error.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
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

}  // namespace

bool valid_triton_model_name(const std::string& name) {
  if (name.empty() || name[0] == '.' || name.size() > 200) return false;
  for (const char c : name) {
    const bool ok = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                    c == '-' || c == '.';
    if (!ok) return false;
  }
  return true;
}

namespace {

std::string instance_group(const TritonSettings& s) {
  return "instance_group [\n  {\n    count: " + std::to_string(s.instances) + "\n    kind: " +
         (s.instance_kind == "gpu" ? "KIND_GPU" : "KIND_CPU") + "\n  }\n]\n";
}

// A double as Python reads it back: the shortest text that round-trips.
std::string python_float(double v) {
  char buf[64];
  for (int digits = 1; digits <= 17; ++digits) {
    std::snprintf(buf, sizeof buf, "%.*g", digits, v);
    if (std::strtod(buf, nullptr) == v) break;
  }
  std::string text = buf;
  if (text.find_first_of(".en") == std::string::npos) text += ".0";
  return text;
}

}  // namespace

std::string triton_preprocessing_name(const TritonSettings& s) { return s.name + "_preprocessing"; }
std::string triton_ensemble_name(const TritonSettings& s) { return s.name + "_ensemble"; }

void check_triton_settings(const TritonSettings& s) {
  if (!valid_triton_model_name(s.name)) {
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
  if (s.preprocessing != "dali" && s.preprocessing != "none") {
    throw Error("--preprocessing '" + s.preprocessing + "': expected dali | none");
  }
  if (s.backend != "onnxruntime" && s.backend != "openvino") {
    throw Error("--backend '" + s.backend + "': expected onnxruntime | openvino");
  }
  if (s.backend == "openvino" && s.instance_kind != "cpu") {
    throw Error("--backend openvino needs --instance-kind cpu: Triton's OpenVINO backend runs on the CPU");
  }
  if (s.backend == "openvino" && s.accelerator != "none") {
    throw Error("--backend-accelerator " + s.accelerator + " is ONNX Runtime's; --backend openvino takes none");
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
    << "backend: " << quoted(s.backend) << "\n";
  // OpenVINO's backend looks for model.xml unless told; it reads the ONNX graph itself.
  if (s.backend == "openvino") o << "default_model_filename: \"model.onnx\"\n";
  o << "max_batch_size: " << s.max_batch_size << "\n"
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
    << instance_group(s);
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

std::string triton_dali_config_text(const TritonSettings& s, const TritonGraph& g) {
  std::ostringstream o;
  o << "# Triton's DALI backend: " << g.arch << "'s eval transform from encoded image bytes (1/dali.py, which the\n"
    << "# backend serializes when it loads the model), written by convnets export --format triton.\n"
    << "name: " << quoted(triton_preprocessing_name(s)) << "\n"
    << "backend: \"dali\"\n"
    << "max_batch_size: " << s.max_batch_size << "\n"
    << "input [\n  {\n    name: \"DALI_INPUT_0\"\n    data_type: TYPE_UINT8\n    dims: [ -1 ]\n  }\n]\n"
    << "output [\n  {\n    name: \"DALI_OUTPUT_0\"\n    data_type: " << (g.fp16 ? "TYPE_FP16" : "TYPE_FP32")
    << "\n    dims: [ 3, " << g.image_size << ", " << g.image_size << " ]\n  }\n]\n"
    << instance_group(s);
  return o.str();
}

std::string triton_ensemble_config_text(const TritonSettings& s, const TritonGraph& g) {
  std::ostringstream o;
  o << "# Encoded images in, " << g.arch << "'s logits out: " << triton_preprocessing_name(s) << " (DALI) then "
    << s.name << " (ONNX Runtime),\n# written by convnets export --format triton.\n"
    << "name: " << quoted(triton_ensemble_name(s)) << "\n"
    << "platform: \"ensemble\"\n"
    << "max_batch_size: " << s.max_batch_size << "\n"
    << "input [\n  {\n    name: \"INPUT\"\n    data_type: TYPE_UINT8\n    dims: [ -1 ]\n  }\n]\n"
    << "output [\n  {\n    name: \"LOGITS\"\n    data_type: " << (g.fp16 ? "TYPE_FP16" : "TYPE_FP32")
    << "\n    dims: [ " << g.num_classes << " ]\n";
  if (g.labels) o << "    label_filename: \"labels.txt\"\n";
  o << "  }\n]\n"
    << "ensemble_scheduling {\n  step [\n"
    << "    {\n      model_name: " << quoted(triton_preprocessing_name(s)) << "\n      model_version: -1\n"
    << "      input_map { key: \"DALI_INPUT_0\" value: \"INPUT\" }\n"
    << "      output_map { key: \"DALI_OUTPUT_0\" value: \"preprocessed\" }\n    },\n"
    << "    {\n      model_name: " << quoted(s.name) << "\n      model_version: -1\n"
    << "      input_map { key: \"input\" value: \"preprocessed\" }\n"
    << "      output_map { key: \"logits\" value: \"LOGITS\" }\n    }\n  ]\n}\n";
  return o.str();
}

// convnets' eval transform (data/transforms.cpp eval_geometry) in DALI's operators, integer for integer: the short
// side to floor(size / crop_ratio), the long side to floor(short target * long / short), the crop's offset the
// margin / 2 rounded half to even; DALI's resampling then differs by at most one level of 255 (bilinear).
std::string triton_dali_pipeline(const TritonSettings& s, const TritonGraph& g) {
  if (g.interpolation != "bilinear" && g.interpolation != "bicubic") {
    throw Error("--preprocessing dali: " + g.arch + "'s interpolation '" + g.interpolation +
                "' has no DALI equivalent here (bilinear | bicubic)");
  }
  const int short_side = static_cast<int>(std::floor(g.image_size / g.crop_ratio + 1e-9));
  std::ostringstream o;
  o << "\"\"\"" << g.arch << "'s eval preprocessing for Triton's DALI backend, written by `convnets export --format triton`.\n"
    << "\n"
    << "convnets' eval transform in DALI operators: decode to RGB; resize the short side to SHORT_SIDE and the long\n"
    << "side in proportion, truncated; centre-crop SIZE x SIZE, an odd margin split as convnets rounds it (half to\n"
    << "even); normalize with the model's mean and std; CHW. Triton's DALI backend serializes `pipeline` when it\n"
    << "loads the model (autoserialize). `transform` is the same graph for a pipeline of one's own (device=\"cpu\"\n"
    << "runs without a GPU).\n"
    << "\"\"\"\n"
    << "import nvidia.dali as dali\n"
    << "import nvidia.dali.fn as fn\n"
    << "import nvidia.dali.math as dmath\n"
    << "import nvidia.dali.types as types\n"
    << "from nvidia.dali.plugin.triton import autoserialize\n\n"
    << "SIZE = " << g.image_size << "\n"
    << "SHORT_SIDE = " << short_side << "\n"
    << "MEAN = [" << python_float(g.mean[0] * 255) << ", " << python_float(g.mean[1] * 255) << ", "
    << python_float(g.mean[2] * 255) << "]  # the model's, in 0..255\n"
    << "STD = [" << python_float(g.std[0] * 255) << ", " << python_float(g.std[1] * 255) << ", "
    << python_float(g.std[2] * 255) << "]\n"
    << "INTERPOLATION = types." << (g.interpolation == "bicubic" ? "INTERP_CUBIC" : "INTERP_LINEAR") << "\n"
    << "OUTPUT_TYPE = types." << (g.fp16 ? "FLOAT16" : "FLOAT") << "\n"
    << "DEVICE = " << (s.instance_kind == "gpu" ? "\"gpu\"" : "\"cpu\"") << "\n"
    << "MAX_BATCH_SIZE = " << s.max_batch_size << "\n\n\n"
    << "def _crop_position(margin):\n"
    << "    # The offset convnets takes, margin / 2 rounded half to even, as DALI's relative position; the quarter\n"
    << "    # pixel keeps DALI's rounding of position x margin on that offset.\n"
    << "    half = margin // 2\n"
    << "    offset = half + (margin % 2) * (half % 2)\n"
    << "    return (fn.cast(offset, dtype=types.FLOAT) + 0.25) / fn.cast(dmath.max(margin, 1), dtype=types.FLOAT)\n\n\n"
    << "def transform(encoded, device=DEVICE):\n"
    << "    \"\"\"Encoded images (uint8, one per sample) to the model's input, CHW.\"\"\"\n"
    << "    images = fn.decoders.image(encoded, device=\"mixed\" if device == \"gpu\" else \"cpu\", "
       "output_type=types.RGB)\n"
    << "    shape = fn.peek_image_shape(encoded)\n"
    << "    height, width = shape[0], shape[1]\n"
    << "    short = dmath.min(height, width)\n"
    << "    resized_width = (width * SHORT_SIDE) // short\n"
    << "    resized_height = (height * SHORT_SIDE) // short\n"
    << "    images = fn.resize(images, resize_x=fn.cast(resized_width, dtype=types.FLOAT),\n"
    << "                       resize_y=fn.cast(resized_height, dtype=types.FLOAT), interp_type=INTERPOLATION,\n"
    << "                       antialias=True)\n"
    << "    return fn.crop_mirror_normalize(images, crop=(SIZE, SIZE), crop_pos_x=_crop_position(resized_width - SIZE),\n"
    << "                                    crop_pos_y=_crop_position(resized_height - SIZE), mean=MEAN, std=STD,\n"
    << "                                    dtype=OUTPUT_TYPE, output_layout=\"CHW\")\n\n\n"
    << "@autoserialize\n"
    << "@dali.pipeline_def(batch_size=MAX_BATCH_SIZE, num_threads=4, device_id=0 if DEVICE == \"gpu\" else None)\n"
    << "def pipeline():\n"
    << "    return transform(fn.external_source(device=\"cpu\", name=\"DALI_INPUT_0\", dtype=types.UINT8, ndim=1))\n";
  return o.str();
}

}  // namespace convnets::deploy
