#include "serve/shared_memory.h"

#include <cerrno>
#include <cstring>
#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

namespace convnets::serve {

// The object's descriptor, read-only, closed when the last user lets go. Reads go through pread, never a mapping:
// a client that shrinks the object after registering it makes a read come up short, which is an error for its
// request, where a mapped page past the object's new end would kill the server with SIGBUS.
struct SharedMemoryRegions::Descriptor {
  int fd = -1;
  ~Descriptor() {
    if (fd >= 0) ::close(fd);
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
  auto descriptor = std::make_shared<Descriptor>();
  descriptor->fd = fd;
  std::lock_guard<std::mutex> lock(mutex_);
  check_room(name);  // again: other registrations may have come between the two locks
  regions_[name] = Region{Status{name, key, offset, byte_size}, std::move(descriptor)};
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

SharedMemoryRegions::Bound SharedMemoryRegions::bind(const InferRequest& request) const {
  Bound bound;
  bound.regions_.resize(request.inputs.size());
  for (std::size_t i = 0; i < request.inputs.size(); ++i) {
    const auto& t = request.inputs[i];
    if (!t.shared_memory) continue;
    const SharedMemoryRef& ref = *t.shared_memory;
    const std::string where = "input " + in_quotes(t.name);
    auto& [region, descriptor] = bound.regions_[i];
    {
      std::lock_guard<std::mutex> lock(mutex_);
      const auto it = regions_.find(ref.region);
      if (it == regions_.end()) bad(400, where + ": " + region_text(ref.region) + " is not registered");
      descriptor = it->second.descriptor;
      region = it->second.status;
    }
    if (ref.offset > region.byte_size || ref.byte_size > region.byte_size - ref.offset) {
      bad(400, where + ": shared_memory_offset " + std::to_string(ref.offset) + " + shared_memory_byte_size " +
                   std::to_string(ref.byte_size) + " is past the end of " + region_text(ref.region) + " (" +
                   std::to_string(region.byte_size) + " bytes)");
    }
  }
  return bound;
}

void SharedMemoryRegions::read(InferRequest& request, const Bound& bound) const {
  for (std::size_t i = 0; i < request.inputs.size(); ++i) {
    auto& t = request.inputs[i];
    if (!t.shared_memory) continue;
    const SharedMemoryRef ref = *t.shared_memory;
    const std::string where = "input " + in_quotes(t.name);
    const auto& [region, descriptor] = bound.regions_.at(i);
    if (!descriptor) bad(400, where + ": " + region_text(ref.region) + " was not looked up when the request came");
    const auto at = static_cast<off_t>(region.offset + ref.offset);
    auto read_into = [&](char* dst, std::size_t n) {
      for (std::size_t got = 0; got < n;) {
        const ssize_t r = ::pread(descriptor->fd, dst + got, n - got, at + static_cast<off_t>(got));
        if (r < 0 && errno == EINTR) continue;
        if (r < 0) bad(400, where + ": reading " + region_text(ref.region) + ": " + std::strerror(errno));
        if (r == 0) {
          bad(400, where + ": " + region_text(ref.region) + " ends " + std::to_string(got) + " bytes into the " +
                       std::to_string(n) + " asked: its object " + in_quotes(region.key) +
                       " was shrunk after it was registered (unregister a region before resizing its object)");
        }
        got += static_cast<std::size_t>(r);
      }
    };
    const std::string from = where + " (from " + region_text(ref.region) + ")";
    const std::int64_t expected = t.element_count();
    if (t.datatype != DataType::Bytes &&
        ref.byte_size == static_cast<std::uint64_t>(expected) * element_size(t.datatype)) {
      t.data.resize(static_cast<std::size_t>(ref.byte_size));  // the tensor's bytes, read in place
      read_into(t.data.data(), t.data.size());
    } else {
      std::string bytes(static_cast<std::size_t>(ref.byte_size), '\0');
      read_into(bytes.data(), bytes.size());
      read_binary_data(t, bytes, expected, from);
    }
    t.shared_memory.reset();
  }
}

}  // namespace convnets::serve
