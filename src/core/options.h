// The options that several commands, modules or front ends take, each declared once (its keyword name, its allowed values, its check), and how the caller spells an option in an error.
#pragma once

#include <string>
#include <vector>

namespace convnets::options {

// Whose spelling an error uses: the CLI's flag (--crop-padding) or the Python
// package's keyword argument (crop_padding). One per process: the executable
// is the CLI, and the Python module says so when it is imported; nothing runs
// both fronts in one process.
enum class Naming { Cli, Python };
void set_naming(Naming naming);
Naming naming();

// `field` is the keyword spelling ("crop_padding"): "--crop-padding" from the
// CLI, "crop_padding" from Python.
std::string name(const std::string& field);
// An option with its value as the caller writes it: "--precision amp" or
// "precision='amp'".
std::string setting(const std::string& field, const std::string& value);

// An option whose value is one of a fixed list. The CLI's parsers, the
// recipes' check, the library's own check (a Python caller reaches it without
// a parser) and the Python package's documented values all read this list.
struct Choice {
  const char* id;     // the declaration's own name: train_interpolation
  const char* field;  // the option it checks: interpolation
  std::vector<std::string> values;

  // "a | b | c", as errors and help list them.
  std::string listed() const;
  bool allows(const std::string& value) const;
};

extern const Choice precision;           // fp32 | tf32 | amp | bf16
extern const Choice device;              // auto | cpu | cuda
extern const Choice memory_format;       // nhwc | nchw
extern const Choice engine;              // auto | torch | openvino
extern const Choice bad_images;          // skip | fail
extern const Choice remode;              // timm's random-erasing fill
extern const Choice eval_interpolation;  // bilinear | bicubic
extern const Choice train_interpolation; // bilinear | bicubic | random (timm's per-sample choice)
extern const Choice calibration_method;  // INT8 calibration
extern const Choice int8_activations;    // uint8 | int8
extern const Choice int8_silu;           // ops | float
extern const Choice data_backend;        // auto | cpu | gpu
extern const Choice key_layout;          // auto | torchvision | timm | dle | gpunet: a weights file's names

// Every declared choice, for the Python package's `convnets.choices()` and
// the test that keeps its documentation to these lists.
const std::vector<const Choice*>& all_choices();

// Throws "NAME 'value': expected a | b | c", NAME as the caller spells
// c.field, or `as` where the value came from elsewhere (a recipe's field).
void check(const Choice& c, const std::string& value);
void check(const Choice& c, const std::string& value, const std::string& as);

// torchvision's RandomCrop(size, padding) after the resized crop: a shift of
// 0 .. image_size - 1 pixels, on training only. `image_size` 0: not known yet
// (a recipe that leaves the size to the architecture).
void check_crop_padding(long long padding, long long image_size, bool train);

}  // namespace convnets::options
