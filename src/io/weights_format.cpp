#include "io/weights_format.h"

#include "core/error.h"
#include "io/safetensors.h"
#include "io/torch_save.h"

#include <algorithm>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <functional>
#include <optional>

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

namespace convnets {
namespace {

// A file or a buffer, as each check reads it.
struct Source {
  std::string name;
  std::uint64_t size = 0;
  ReadAt read;
  std::function<std::optional<Error>()> archive_problem;
  std::function<void()> refuse_legacy;  // read_torch_save's refusal, by name
};

WeightsFormat decide(const Source& file) {
  const std::optional<Error> not_safetensors = safetensors_structure_problem(file.size, file.read, file.name);
  if (!not_safetensors) return WeightsFormat::Safetensors;
  unsigned char head[32] = {};
  const auto n = static_cast<std::size_t>(std::min<std::uint64_t>(sizeof head, file.size));
  file.read(reinterpret_cast<char*>(head), n, 0);
  if (is_legacy_torch_save(head, n)) file.refuse_legacy();
  const std::optional<Error> not_archive = file.archive_problem();
  if (!not_archive) return WeightsFormat::TorchSave;
  const bool zip = n >= 2 && head[0] == 'P' && head[1] == 'K';
  const Error& first = zip ? *not_archive : *not_safetensors;
  throw Error(std::string(first.what()) +
                  (zip ? "; nor is it a safetensors file"
                       : "; nor is it a torch.save archive (a zip holding data.pkl) or a pre-1.6 torch.save pickle"),
              first.hint(), first.kind());
}

}  // namespace

WeightsFormat weights_format(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw SystemError("cannot open weights file", path);
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{fd};
  struct stat st {};
  if (::fstat(fd, &st) != 0) throw SystemError("cannot stat weights file", path);
  if (S_ISDIR(st.st_mode)) throw Error("weights file '" + path + "' is a directory", "name a .safetensors or .pth file");
  Source file;
  file.name = path;
  file.size = static_cast<std::uint64_t>(st.st_size);
  file.read = [&](char* to, std::uint64_t n, std::uint64_t at) {
    for (const std::uint64_t end = at + n; at < end;) {
      const ssize_t r = ::pread(fd, to, end - at, static_cast<off_t>(at));
      if (r < 0 && errno == EINTR) continue;
      if (r < 0) throw SystemError("read failed in", path);
      if (r == 0) throw Error("weights file '" + path + "' ended at byte " + std::to_string(at) + " while it was read",
                              "another process truncated it");
      at += static_cast<std::uint64_t>(r), to += r;
    }
  };
  file.archive_problem = [&] { return torch_save_archive_problem(path); };
  file.refuse_legacy = [&] { read_torch_save(path); };
  return decide(file);
}

WeightsFormat weights_format(const void* data, std::size_t size, const std::string& name) {
  const auto* bytes = static_cast<const char*>(data);
  Source file;
  file.name = name;
  file.size = size;
  file.read = [&](char* to, std::uint64_t n, std::uint64_t at) { std::memcpy(to, bytes + at, n); };
  file.archive_problem = [&] { return torch_save_archive_problem(data, size, name); };
  file.refuse_legacy = [&] { read_torch_save_bytes(data, size, name); };
  return decide(file);
}

}  // namespace convnets
