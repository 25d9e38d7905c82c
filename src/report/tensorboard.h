// TensorBoard event files: TFRecord framing with masked CRC-32C around hand-encoded Event/Summary protobuf messages.
#pragma once

#include <cstdint>
#include <fstream>
#include <string>

namespace convnets::report {

// TFRecord's masked form of CRC-32C (core/crc32c.h; tensorflow/core/lib/hash/crc32c.h: rotate right by 15, add
// 0xa282ead8), which a reader checks on every length and payload.
std::uint32_t masked_crc32c(const std::uint8_t* data, std::size_t size);

// One event file, written the way tf.summary / tensorboardX write theirs, so
// that TensorBoard reads it: records of [uint64 length][masked crc of the
// length][Event bytes][masked crc of the bytes], the first Event carrying
// file_version "brain.Event:2". Each writer opens a new file
// (DIR/events.out.tfevents.<seconds>.<host>.<pid>.convnets): a resumed run
// never appends to a file an interrupted one may have cut mid-record, and
// TensorBoard reads every file of the folder in name order.
class EventWriter {
 public:
  // Creates `dir` if needed; throws Error naming it when it cannot.
  explicit EventWriter(const std::string& dir);
  const std::string& path() const { return path_; }

  // Summary.Value.simple_value (float, as TensorBoard stores scalars).
  void scalar(const std::string& tag, std::int64_t step, double value);
  // The text plugin's form: a string tensor with plugin_data "text" (markdown).
  void text(const std::string& tag, std::int64_t step, const std::string& markdown);
  // Summary.Image: an encoded PNG of `height` x `width` with `channels` (1 or 3).
  void image(const std::string& tag, std::int64_t step, const std::string& png, int height, int width, int channels);
  // SessionLog START at `step`: TensorBoard drops the events of earlier files
  // at this step or later (they came from a run that was interrupted and resumed
  // from an earlier checkpoint), so no step is shown twice.
  void session_start(std::int64_t step);
  // Pushes what was written to the file (a live TensorBoard reads it).
  void flush();

 private:
  void event(std::int64_t step, int field, const std::string& payload);
  void record(const std::string& event_bytes);  // one TFRecord
  std::string path_;
  std::ofstream out_;
};

}  // namespace convnets::report
