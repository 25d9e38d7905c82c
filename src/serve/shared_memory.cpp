#include "serve/shared_memory.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace convnets::serve {

// The pages of one region, from the page boundary at or below its offset; unmapped when the last user lets go.
struct SharedMemoryRegions::Mapping {
  void* base = MAP_FAILED;
  std::size_t length = 0;
  const char* begin = nullptr;  // the region's first byte (its offset into the object)
  ~Mapping() {
    if (base != MAP_FAILED) munmap(base, length);
  }
};

namespace {

[[noreturn]] void bad(int status, const std::string& what) { throw ProtocolError(status, what); }

std::string region_text(const std::string& name) { return "shared memory region " + in_quotes(name); }

}  // namespace

void SharedMemoryRegions::add(const std::string& name, const std::string& key, std::uint64_t offset,
                              std::uint64_t byte_size) {
  Limits names;
  check_name(name, names, "a shared memory region's name");
  check_name(key, names, region_text(name) + "'s key");
  if (byte_size == 0) bad(400, region_text(name) + ": byte_size must be more than 0");
  {
    std::lock_guard<std::mutex> lock(mutex_);
    check_room(name);
  }
  // Read-only: a client's region can be read from, never written or grown by the server.
  const int fd = shm_open(key.c_str(), O_RDONLY, 0);
  if (fd < 0) {
    bad(400, region_text(name) + ": cannot open the shared memory object " + in_quotes(key) + ": " +
                 std::strerror(errno));
  }
  struct stat st {};
  if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    bad(400, region_text(name) + ": " + in_quotes(key) + " is not a shared memory object");
  }
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (offset > size || byte_size > size - offset) {
    ::close(fd);
    bad(400, region_text(name) + ": offset " + std::to_string(offset) + " + byte_size " + std::to_string(byte_size) +
                 " is past the end of " + in_quotes(key) + " (" + std::to_string(size) + " bytes)");
  }
  const auto page = static_cast<std::uint64_t>(sysconf(_SC_PAGESIZE));
  const std::uint64_t start = offset / page * page;
  auto mapping = std::make_shared<Mapping>();
  mapping->length = static_cast<std::size_t>(offset - start + byte_size);
  mapping->base = mmap(nullptr, mapping->length, PROT_READ, MAP_SHARED, fd, static_cast<off_t>(start));
  const int mmap_errno = errno;
  ::close(fd);  // the mapping keeps the object; no descriptor per region
  if (mapping->base == MAP_FAILED) {
    bad(400, region_text(name) + ": cannot map " + in_quotes(key) + ": " + std::strerror(mmap_errno));
  }
  mapping->begin = static_cast<const char*>(mapping->base) + (offset - start);
  std::lock_guard<std::mutex> lock(mutex_);
  check_room(name);  // again: other registrations may have come between the two locks
  regions_[name] = Region{Status{name, key, offset, byte_size}, std::move(mapping)};
}

void SharedMemoryRegions::check_room(const std::string& name) const {
  if (regions_.count(name)) bad(400, region_text(name) + " is already registered (unregister it first)");
  if (regions_.size() >= max_regions_) {
    bad(400, region_text(name) + ": " + std::to_string(max_regions_) + " regions are registered, the most at once");
  }
}

void SharedMemoryRegions::remove(const std::string& name) {
  std::lock_guard<std::mutex> lock(mutex_);
  if (name.empty()) {
    regions_.clear();
  } else {
    regions_.erase(name);
  }
}

std::vector<SharedMemoryRegions::Status> SharedMemoryRegions::status(const std::string& name) const {
  std::lock_guard<std::mutex> lock(mutex_);
  std::vector<Status> out;
  if (name.empty()) {
    for (const auto& [n, r] : regions_) out.push_back(r.status);
    return out;
  }
  const auto it = regions_.find(name);
  if (it == regions_.end()) bad(404, region_text(name) + " is not registered");
  out.push_back(it->second.status);
  return out;
}

void SharedMemoryRegions::resolve(InferRequest& request) const {
  for (auto& t : request.inputs) {
    if (!t.shared_memory) continue;
    const SharedMemoryRef ref = *t.shared_memory;
    const std::string where = "input " + in_quotes(t.name);
    std::shared_ptr<const Mapping> mapping;
    std::uint64_t region_size = 0;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = regions_.find(ref.region);
      if (it == regions_.end()) bad(400, where + ": " + region_text(ref.region) + " is not registered");
      mapping = it->second.mapping;
      region_size = it->second.status.byte_size;
    }
    if (ref.offset > region_size || ref.byte_size > region_size - ref.offset) {
      bad(400, where + ": shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                   std::to_string(ref.byte_size) + " is past the end of " + region_text(ref.region) + " (" +
                   std::to_string(region_size) + " bytes)");
    }
    read_binary_data(t, std::string_view(mapping->begin + ref.offset, static_cast<std::size_t>(ref.byte_size)),
                     t.element_count(), where + " (from " + region_text(ref.region) + ")");
    t.shared_memory.reset();
  }
}

}  // namespace convnets::serve
