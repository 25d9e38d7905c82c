// All-or-nothing file writes: a temporary file beside the target, fsynced, then renamed over it.
#pragma once

#include <cstddef>
#include <string>

namespace convnets {

// An interrupted or failed write leaves the previous `path` untouched: data
// goes to PATH.tmp.PID, which commit() fsyncs and renames over `path`; without
// commit() the temporary file is removed. Errors name the file.
class AtomicFile {
 public:
  explicit AtomicFile(std::string path);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  void commit();

 private:
  void fail(const std::string& what);
  std::string path_, tmp_;
  int fd_ = -1;
};

void write_file_atomically(const std::string& path, const std::string& contents);
// Copies `from` to `to` through an AtomicFile (e.g. last -> best checkpoint).
void copy_file_atomically(const std::string& from, const std::string& to);

}  // namespace convnets
