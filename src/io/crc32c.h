// CRC-32C (Castagnoli), the checksum a checkpoint's tensors carry: the one iSCSI, ext4 and Google's crc32c package
// compute, so any reader can check a file convnets wrote.
#pragma once

#include <cstddef>
#include <cstdint>

namespace convnets {

// CRC-32C of `size` bytes, continuing `crc` (the value returned for the bytes before them; 0 to start):
// crc32c(b, crc32c(a)) == crc32c(a followed by b). crc32c("123456789") == 0xE3069283 (RFC 3720's check value).
// SSE4.2's crc32 instruction on three interleaved streams where the CPU has it (about 3 bytes a cycle), a
// table otherwise.
std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc = 0);

// The same through the table alone, whatever the CPU: the reference the hardware path is tested against.
std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc = 0);

}  // namespace convnets
