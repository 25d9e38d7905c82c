// Triton's system shared-memory extension: the POSIX shared-memory regions clients register by key, read through a descriptor kept open, and the inputs a request reads from them instead of from its body.
#pragma once

#include "kserve/messages.h"

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace convnets::serve {

// The server speaks the protocol kserve/messages.h reads and writes.
using namespace kserve;

// A client that writes its tensors into shared memory sends each request as a few hundred bytes of JSON or
// protobuf: on one machine the 0.6-1.2 MB image bodies are then not copied through the loopback socket twice
// (Triton's perf_analyzer --shared-memory system measures serving this way). Regions are opened read-only and read
// with pread, never mapped, so an object a client shrinks after registering it fails that client's requests (400,
// naming the region) instead of killing the server with SIGBUS. The server writes no output into them (a request
// asking for that is refused, naming the output).
class SharedMemoryRegions {
 public:
  struct Status {
    std::string name, key;
    std::uint64_t offset = 0, byte_size = 0;
  };

  // At most `max_regions` at once: each holds a read-only descriptor until it is unregistered or the server ends.
  explicit SharedMemoryRegions(std::size_t max_regions = 1024) : max_regions_(max_regions) {}

  // Registers `byte_size` bytes at `offset` of the shared-memory object `key` (shm_open's name) as region `name`.
  // ProtocolError 400 naming the region or key: a name already registered, a key that cannot be opened, a range
  // past the object's end, a zero size, or too many regions.
  void add(const std::string& name, const std::string& key, std::uint64_t offset, std::uint64_t byte_size);
  // Unregisters `name` ("" every region). An unknown name is not an error (Triton's unregister is idempotent).
  void remove(const std::string& name);
  // Every region ("") or the one named; ProtocolError 404 for a name not registered.
  std::vector<Status> status(const std::string& name) const;

 private:
  struct Descriptor;

 public:
  // The regions a request's inputs name, looked up when it came: it reads them through the descriptors held here,
  // so that an unregister (and the object's unlink) while it waits for a worker leaves its bytes readable, as
  // they were when it was sent.
  class Bound {
   private:
    friend class SharedMemoryRegions;
    std::vector<std::pair<Status, std::shared_ptr<const Descriptor>>> regions_;  // per input; none for a body's
  };
  // Looks up the region of each of the request's inputs that names one (ProtocolError 400 naming the input and
  // the region: not registered, or a range outside it).
  Bound bind(const InferRequest& request) const;
  // Each of those inputs gets its elements from its region through `bound`, checked as binary data is
  // (ProtocolError 400 naming the input and the region: an object shrunk below the range since it was registered).
  void read(InferRequest& request, const Bound& bound) const;

 private:
  struct Region {
    Status status;
    std::shared_ptr<const Descriptor> descriptor;  // a request bound to it keeps it open through an unregister
  };
  // ProtocolError 400 for a name already registered or no room for another region; with mutex_ held.
  void check_room(const std::string& name) const;

  std::size_t max_regions_;
  mutable std::mutex mutex_;
  std::map<std::string, Region> regions_;
};

}  // namespace convnets::serve
