#include "deploy/triton_repo.h"

#include "core/error.h"

#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <sstream>

namespace convnets::deploy {

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

std::pair<int, std::string> instance_group(const TritonSettings& s) {
  return {s.batching.instances, s.instance_kind == "gpu" ? "KIND_GPU" : "KIND_CPU"};
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
  s.batching.validate();
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
  ModelConfig c;
  c.comment = {"A Triton Inference Server model configuration (model_config.proto), written by convnets export "
               "--format triton",
               "for " + g.arch + ". The graph is 1/model.onnx; input and output names are the graph's."};
  c.name = s.name;
  c.backend = s.backend;
  // OpenVINO's backend looks for model.xml unless told; it reads the ONNX graph itself.
  if (s.backend == "openvino") c.default_model_filename = "model.onnx";
  c.max_batch_size = s.batching.max_batch_size;
  c.inputs = {{"input", type, {3, g.image_size, g.image_size}, "FORMAT_NCHW", ""}};
  c.outputs = {{"logits", type, {g.num_classes}, "", g.labels ? "labels.txt" : ""}};
  c.dynamic_batching = s.batching;
  c.instance_group = instance_group(s);
  if (s.accelerator == "trt") {
    c.gpu_accelerators = {{"tensorrt",
                           {{"precision_mode", s.trt_precision == "fp16" ? "FP16" : "FP32"},
                            {"max_workspace_size_bytes", "1073741824"}}}};
  }
  // A client that sends decoded images needs the model's eval transform; Triton passes parameters through.
  c.parameters = {{"convnets.preprocessing", g.preprocessing}};
  return config_pbtxt(c);
}

std::string triton_dali_config_text(const TritonSettings& s, const TritonGraph& g) {
  ModelConfig c;
  c.comment = {"Triton's DALI backend: " + g.arch + "'s eval transform from encoded image bytes (1/dali.py, which the",
               "backend serializes when it loads the model), written by convnets export --format triton."};
  c.name = triton_preprocessing_name(s);
  c.backend = "dali";
  c.max_batch_size = s.batching.max_batch_size;
  c.inputs = {{"DALI_INPUT_0", "TYPE_UINT8", {-1}, "", ""}};
  c.outputs = {{"DALI_OUTPUT_0", g.fp16 ? "TYPE_FP16" : "TYPE_FP32", {3, g.image_size, g.image_size}, "", ""}};
  c.instance_group = instance_group(s);
  return config_pbtxt(c);
}

std::string triton_ensemble_config_text(const TritonSettings& s, const TritonGraph& g) {
  ModelConfig c;
  c.comment = {"Encoded images in, " + g.arch + "'s logits out: " + triton_preprocessing_name(s) + " (DALI) then " +
                   s.name + " (ONNX Runtime),",
               "written by convnets export --format triton."};
  c.name = triton_ensemble_name(s);
  c.platform = "ensemble";
  c.max_batch_size = s.batching.max_batch_size;
  c.inputs = {{"INPUT", "TYPE_UINT8", {-1}, "", ""}};
  c.outputs = {{"LOGITS", g.fp16 ? "TYPE_FP16" : "TYPE_FP32", {g.num_classes}, "", g.labels ? "labels.txt" : ""}};
  c.ensemble_steps = {{triton_preprocessing_name(s), {{"DALI_INPUT_0", "INPUT"}}, {{"DALI_OUTPUT_0", "preprocessed"}}},
                      {s.name, {{"input", "preprocessed"}}, {{"logits", "LOGITS"}}}};
  return config_pbtxt(c);
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
    << "MAX_BATCH_SIZE = " << s.batching.max_batch_size << "\n\n\n"
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
