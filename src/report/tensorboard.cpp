#include "report/tensorboard.h"

#include "core/crc32c.h"
#include "core/error.h"

#include <unistd.h>

#include <array>
#include <chrono>
#include <cstring>
#include <filesystem>

namespace convnets::report {
namespace fs = std::filesystem;

namespace {

// Protocol buffers' wire format (developers.google.com/protocol-buffers/docs/encoding),
// only what the Event, Summary and TensorProto messages used here need.
void varint(std::string& out, std::uint64_t v) {
  while (v >= 0x80) {
    out.push_back(static_cast<char>((v & 0x7F) | 0x80));
    v >>= 7;
  }
  out.push_back(static_cast<char>(v));
}

void key(std::string& out, int field, int wire) { varint(out, (static_cast<std::uint64_t>(field) << 3) | wire); }

void field_varint(std::string& out, int field, std::uint64_t v) {
  key(out, field, 0);
  varint(out, v);
}

void field_bytes(std::string& out, int field, const std::string& bytes) {
  key(out, field, 2);
  varint(out, bytes.size());
  out += bytes;
}

void field_double(std::string& out, int field, double v) {
  key(out, field, 1);
  char b[8];
  std::memcpy(b, &v, 8);  // little-endian on every machine convnets builds for
  out.append(b, 8);
}

void field_float(std::string& out, int field, float v) {
  key(out, field, 5);
  char b[4];
  std::memcpy(b, &v, 4);
  out.append(b, 4);
}

// Summary { repeated Value value = 1; } with a single value.
std::string summary(const std::string& value) {
  std::string s;
  field_bytes(s, 1, value);
  return s;
}

std::string host_name() {
  char h[256] = {};
  if (gethostname(h, sizeof h - 1) != 0) return "localhost";
  return h;
}

double wall_time() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

}  // namespace

std::uint32_t masked_crc32c(const std::uint8_t* data, std::size_t size) {
  const std::uint32_t c = crc32c(data, size);
  return ((c >> 15) | (c << 17)) + 0xa282ead8u;
}

EventWriter::EventWriter(const std::string& dir) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec || !fs::is_directory(dir)) {
    throw Error("--tensorboard " + dir + ": cannot create the folder" + (ec ? ": " + ec.message() : ""));
  }
  const auto seconds = static_cast<long long>(wall_time());
  path_ = (fs::path(dir) / ("events.out.tfevents." + std::to_string(seconds) + "." + host_name() + "." +
                            std::to_string(getpid()) + ".convnets"))
              .string();
  out_.open(path_, std::ios::binary | std::ios::app);
  if (!out_) throw Error("--tensorboard: cannot write " + path_ + ": " + std::strerror(errno));
  std::string e;
  field_double(e, 1, wall_time());
  field_bytes(e, 3, "brain.Event:2");  // Event.file_version
  record(e);
  flush();
}

void EventWriter::event(std::int64_t step, int field, const std::string& payload) {
  std::string e;
  field_double(e, 1, wall_time());                       // Event.wall_time
  field_varint(e, 2, static_cast<std::uint64_t>(step));  // Event.step
  field_bytes(e, field, payload);                        // Event.summary (5) or .session_log (7)
  record(e);
}

void EventWriter::record(const std::string& e) {
  const std::uint64_t n = e.size();
  std::uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<std::uint8_t>(n >> (8 * i));
  const std::uint32_t lc = masked_crc32c(len, 8), dc = masked_crc32c(reinterpret_cast<const std::uint8_t*>(e.data()), n);
  out_.write(reinterpret_cast<const char*>(len), 8);
  out_.write(reinterpret_cast<const char*>(&lc), 4);
  out_.write(e.data(), static_cast<std::streamsize>(n));
  out_.write(reinterpret_cast<const char*>(&dc), 4);
  if (!out_) throw Error("--tensorboard: cannot write " + path_ + ": " + std::strerror(errno));
}

void EventWriter::scalar(const std::string& tag, std::int64_t step, double value) {
  std::string v;
  field_bytes(v, 1, tag);                          // Value.tag
  field_float(v, 2, static_cast<float>(value));    // Value.simple_value
  event(step, 5, summary(v));
}

void EventWriter::text(const std::string& tag, std::int64_t step, const std::string& markdown) {
  std::string plugin, metadata, tensor, v;
  field_bytes(plugin, 1, "text");          // PluginData.plugin_name
  field_bytes(metadata, 1, plugin);        // SummaryMetadata.plugin_data
  field_varint(tensor, 1, 7);              // TensorProto.dtype = DT_STRING
  field_bytes(tensor, 2, "");              // TensorProto.tensor_shape: no dims, a scalar
  field_bytes(tensor, 8, markdown);        // TensorProto.string_val
  field_bytes(v, 1, tag);
  field_bytes(v, 9, metadata);             // Value.metadata
  field_bytes(v, 8, tensor);               // Value.tensor
  event(step, 5, summary(v));
}

void EventWriter::image(const std::string& tag, std::int64_t step, const std::string& png, int height, int width,
                        int channels) {
  std::string img, v;
  field_varint(img, 1, static_cast<std::uint64_t>(height));
  field_varint(img, 2, static_cast<std::uint64_t>(width));
  field_varint(img, 3, static_cast<std::uint64_t>(channels));  // colorspace: 1 grey, 3 RGB
  field_bytes(img, 4, png);                                    // encoded_image_string
  field_bytes(v, 1, tag);
  field_bytes(v, 4, img);  // Value.image
  event(step, 5, summary(v));
}

void EventWriter::session_start(std::int64_t step) {
  std::string log;
  field_varint(log, 1, 1);  // SessionLog.status = START
  event(step, 7, log);
}

void EventWriter::flush() { out_.flush(); }

}  // namespace convnets::report
