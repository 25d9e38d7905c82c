// What the host CPU can execute natively: the bf16 a precision choice depends on, and the vector instructions the hand-written paths choose by.
#pragma once

#include <string>

namespace convnets {

// Whether the CPU executes bf16 dot products natively: AVX512_BF16 (Cooper
// Lake, Sapphire Rapids, AMD Zen 4 and newer) or AMX-BF16, with the OS saving
// the AVX-512 state. Elsewhere LibTorch and OpenVINO fall back to emulating
// bf16 in fp32 arithmetic, slower than fp32 itself, so convnets refuses it.
bool cpu_has_native_bf16();

// The bf16 instruction sets found, "AVX512_BF16", "AVX512_BF16, AMX-BF16", or
// "none" (for messages and bench records).
std::string cpu_bf16_instructions();

// Throws Error naming `flag` and the missing instruction sets when the CPU
// has no native bf16.
void require_cpu_bf16(const std::string& flag);

// The instruction sets the hand-written CPU paths choose by: CRC-32C's folds (core/crc32c.h) and the image
// resamplers' AVX2 loops (data/resample.h, data/pil_ops.h). All false off x86-64.
struct CpuVectorFeatures {
  bool sse42 = false;
  bool pclmul = false;          // carry-less multiplication, with SSE4.2
  bool avx2 = false;
  bool avx512_vpclmul = false;  // AVX-512 F and VL with VPCLMULQDQ, with PCLMUL
};
const CpuVectorFeatures& cpu_vector_features();

}  // namespace convnets
