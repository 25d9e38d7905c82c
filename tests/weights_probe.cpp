// weights_probe: a line-oriented window onto convnets' weights files (the format detection, the safetensors reader and writer, the torch.save reader), so the Python tests can hold them against the reference implementations.
//
// One JSON request per line on stdin, one JSON answer per line on stdout, until stdin ends: a whole property-based
// run is one process. Tensors travel as {"name", "dtype" (safetensors' names), "shape", "hex" (their bytes)}.
//   {"read": PATH}   -> {"format", "verified", "metadata", "tensors"}, as every command's load_checkpoint reads PATH
//   {"write": PATH, "tensors": [...], "metadata": {...}, "checksums": true|false} -> {"written": PATH}
// A convnets::Error answers {"error": its message}; anything else ends the probe.
#include "core/error.h"
#include "core/json.h"
#include "io/safetensors.h"
#include "runtime/checkpoint.h"

#include <nlohmann/json.hpp>
#include <torch/torch.h>

#include <cstring>
#include <iostream>
#include <string>

using namespace convnets;

namespace {

std::string hex_of(const torch::Tensor& t) {
  static const char digits[] = "0123456789abcdef";
  const auto c = t.contiguous();
  const auto* p = static_cast<const unsigned char*>(c.data_ptr());
  std::string out(2 * c.numel() * c.element_size(), '0');
  for (std::size_t i = 0; i < out.size() / 2; ++i) out[2 * i] = digits[p[i] >> 4], out[2 * i + 1] = digits[p[i] & 15];
  return out;
}

torch::Tensor from_hex(const nlohmann::json& spec) {
  const std::string name = spec.at("name");
  const auto dtype = safetensors_dtype(spec.at("dtype").get<std::string>());
  if (!dtype) throw Error("tensor '" + name + "': no safetensors dtype " + spec.at("dtype").dump());
  auto t = torch::empty(spec.at("shape").get<std::vector<std::int64_t>>(), torch::TensorOptions().dtype(*dtype));
  const std::string hex = spec.at("hex");
  if (hex.size() != 2 * static_cast<std::size_t>(t.numel()) * t.element_size())
    throw Error("tensor '" + name + "': " + std::to_string(hex.size() / 2) + " bytes for its shape and dtype");
  auto* p = static_cast<unsigned char*>(t.data_ptr());
  for (std::size_t i = 0; i < hex.size() / 2; ++i) p[i] = static_cast<unsigned char>(std::stoi(hex.substr(2 * i, 2), nullptr, 16));
  return t;
}

nlohmann::json read(const std::string& path) {
  const auto ckpt = runtime::load_checkpoint(path);
  nlohmann::json tensors = nlohmann::json::array();
  for (const auto& [name, t] : ckpt.file.tensors) {
    const char* dtype = safetensors_dtype_name(t.scalar_type());
    tensors.push_back({{"name", name}, {"dtype", dtype ? dtype : "?"}, {"shape", t.sizes().vec()}, {"hex", hex_of(t)}});
  }
  const char* verified[] = {"nothing", "bytes", "bytes and header"};
  return {{"format", ckpt.torch_save ? "torch.save" : "safetensors"},
          {"verified", verified[static_cast<int>(ckpt.file.verified)]},
          {"metadata", ckpt.file.metadata},
          {"tensors", tensors}};
}

nlohmann::json write(const nlohmann::json& request) {
  const std::string path = request.at("write");
  NamedTensors tensors;
  for (const auto& spec : request.at("tensors")) tensors.emplace_back(spec.at("name"), from_hex(spec));
  save_safetensors(path, tensors, request.value("metadata", std::map<std::string, std::string>{}),
                   request.value("checksums", true) ? FileChecksums::Crc32c : FileChecksums::None);
  return {{"written", path}};
}

}  // namespace

int main() {
  for (std::string line; std::getline(std::cin, line);) {
    const auto request = nlohmann::json::parse(line);
    nlohmann::json answer;
    try {
      answer = request.contains("read") ? read(request.at("read")) : write(request);
    } catch (const Error& e) {
      answer = {{"error", e.what()}};
    }
    std::cout << dump_json(answer) << std::endl;
  }
  return 0;
}
