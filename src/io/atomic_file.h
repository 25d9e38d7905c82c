// All-or-nothing file writes: a temporary file beside the target, fsynced, then renamed over it.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace convnets {

// An interrupted or failed write leaves the previous `path` untouched: data
// goes to PATH.tmp.PID, which commit() fsyncs and renames over `path`; without
// commit() the temporary file is removed. Errors name the file; a full disk,
// quota or file-size limit names the bytes needed and those free there.
class AtomicFile {
 public:
  // `size`, when known, is reserved before anything is written, so a full
  // disk fails at once instead of part-way through a large checkpoint.
  explicit AtomicFile(std::string path, std::uint64_t size = 0);
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  void write(const void* data, std::size_t size);
  // Writes over bytes already written (`offset + size` at most what write() has written): a header whose
  // fixed-width fields are known only once the data after it is out.
  void rewrite(std::uint64_t offset, const void* data, std::size_t size);
  void commit();

 private:
  [[noreturn]] void fail(const std::string& what, std::uint64_t pending = 0);
  std::string path_, tmp_;
  std::uint64_t size_ = 0, written_ = 0;
  int fd_ = -1;
};

void write_file_atomically(const std::string& path, const std::string& contents);
// Copies `from` to `to` through an AtomicFile (e.g. last -> best checkpoint).
void copy_file_atomically(const std::string& from, const std::string& to);

// Deletes the PATH.tmp.PID files in `dir` whose process is gone (a writer
// killed mid-write: nothing else removes them) and returns their paths.
std::vector<std::string> remove_stale_temporaries(const std::string& dir);

}  // namespace convnets
