// CRC-32C (Castagnoli), the checksum a checkpoint's tensors carry: the one iSCSI, ext4 and Google's crc32c package
// compute, so any reader can check a file convnets wrote.
#pragma once

#include <cstddef>
#include <cstdint>

namespace convnets {

// CRC-32C of `size` bytes, continuing `crc` (the value returned for the bytes before them; 0 to start):
// crc32c(b, crc32c(a)) == crc32c(a followed by b). crc32c("123456789") == 0xE3069283 (RFC 3720's check value).
// Carry-less multiplication where the CPU has it, SSE4.2's crc32 instruction on three interleaved streams
// otherwise (about 3 bytes a cycle), a table without either.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);

// Copies `size` bytes from `source` to `destination` (which must not overlap) and returns their CRC-32C, in one pass
// over memory: where the CPU folds by carry-less multiplication the checksum costs no more than the copy, which
// waits on memory anyway. A checkpoint's tensors are checked this way as they are read and summed as they are
// written.
std::uint32_t crc32c_copy(void* destination, const void* source, std::size_t size, std::uint32_t crc = 0);

// The same through the table alone, whatever the CPU: the reference the hardware path is tested against.
std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc = 0);

// The implementations crc32c() chooses from, fastest first; it takes the first the CPU has. AVX-512's and
// SSE's carry-less multiplication fold the data 256 and 64 bytes a round, the crc32 instruction takes the rest.
enum class Crc32cPath { Vpclmul512, Pclmul, Sse42, Table };
bool crc32c_available(Crc32cPath path);
// crc32c() through `path` (the table where the CPU lacks it): each path tested against the table.
std::uint32_t crc32c_on(Crc32cPath path, const void* data, std::size_t size, std::uint32_t crc = 0);
std::uint32_t crc32c_copy_on(Crc32cPath path, void* destination, const void* source, std::size_t size,
                             std::uint32_t crc = 0);

}  // namespace convnets
