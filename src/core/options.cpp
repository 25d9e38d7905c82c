#include "core/options.h"

#include "core/error.h"

#include <atomic>

namespace convnets::options {
namespace {

std::atomic<Naming> current{Naming::Cli};

}  // namespace

void set_naming(Naming n) { current = n; }
Naming naming() { return current; }

std::string name(const std::string& field) {
  if (naming() == Naming::Python) return field;
  std::string flag = "--" + field;
  for (char& c : flag) c = c == '_' ? '-' : c;
  return flag;
}

std::string setting(const std::string& field, const std::string& value) {
  if (naming() == Naming::Python) return field + "='" + value + "'";
  return name(field) + " " + value;
}

std::string Choice::listed() const { return join(values, " | "); }

bool Choice::allows(const std::string& value) const {
  for (const auto& v : values) {
    if (v == value) return true;
  }
  return false;
}

const Choice precision{"precision", "precision", {"fp32", "tf32", "amp", "bf16"}};
const Choice device{"device", "device", {"auto", "cpu", "cuda"}};
const Choice memory_format{"memory_format", "memory_format", {"nhwc", "nchw"}};
const Choice engine{"engine", "engine", {"auto", "torch", "openvino"}};
const Choice bad_images{"bad_images", "bad_images", {"skip", "fail"}};
const Choice remode{"remode", "remode", {"const", "rand", "pixel"}};
const Choice eval_interpolation{"eval_interpolation", "interpolation", {"bilinear", "bicubic"}};
const Choice train_interpolation{"train_interpolation", "interpolation", {"bilinear", "bicubic", "random"}};
const Choice calibration_method{"calibration_method", "calibration_method", {"minmax", "percentile", "entropy"}};
const Choice int8_activations{"int8_activations", "int8_activations", {"uint8", "int8"}};
const Choice int8_silu{"int8_silu", "int8_silu", {"ops", "float"}};
const Choice data_backend{"data_backend", "data_backend", {"auto", "cpu", "gpu"}};
const Choice key_layout{"key_layout", "key_layout", {"auto", "torchvision", "timm", "dle", "gpunet"}};

const std::vector<const Choice*>& all_choices() {
  static const std::vector<const Choice*> all{&precision,  &device,           &memory_format, &engine,
                                              &bad_images, &remode,           &eval_interpolation,
                                              &train_interpolation, &calibration_method, &int8_activations,
                                              &int8_silu,  &data_backend,     &key_layout};
  return all;
}

void check(const Choice& c, const std::string& value) { check(c, value, name(c.field)); }

void check(const Choice& c, const std::string& value, const std::string& as) {
  if (!c.allows(value)) throw Error(as + " '" + value + "': expected " + c.listed());
}

void check_crop_padding(long long padding, long long image_size, bool train) {
  const std::string got = ", got " + std::to_string(padding);
  if (!train && padding != 0) throw Error(name("crop_padding") + " must be 0 for evaluation (a training shift)" + got);
  if (padding < 0 || (image_size > 0 && padding >= image_size)) {
    const std::string range =
        image_size > 0 ? "in 0.." + std::to_string(image_size - 1) + " (less than " + name("image_size") + ")"
                       : "0 (off) or more";
    throw Error(name("crop_padding") + " must be " + range + got);
  }
}

}  // namespace convnets::options
