#include "core/cpu_features.h"

#include "core/error.h"

#include <cpuid.h>

#include <cstdint>

namespace convnets {
namespace {

struct Bf16 {
  bool avx512 = false, amx = false;
};

std::uint64_t xcr0() {
  std::uint32_t lo = 0, hi = 0;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(0));
  return (std::uint64_t(hi) << 32) | lo;
}

Bf16 detect() {
  Bf16 r;
  unsigned a = 0, b = 0, c = 0, d = 0;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return r;
  const bool osxsave = (c >> 27) & 1;
  if (!osxsave || __get_cpuid_max(0, nullptr) < 7) return r;
  const std::uint64_t xcr = xcr0();
  // opmask, upper ZMM0-15 and ZMM16-31 state (bits 5-7) with SSE/AVX (1-2).
  const bool avx512_state = (xcr & 0xE6) == 0xE6;
  // XTILECFG and XTILEDATA (bits 17-18); Linux also wants arch_prctl
  // permission per process, which oneDNN and OpenVINO request themselves.
  const bool amx_state = ((xcr >> 17) & 3) == 3;
  __cpuid_count(7, 0, a, b, c, d);
  const bool avx512f = (b >> 16) & 1;
  r.amx = amx_state && ((d >> 22) & 1);  // AMX-BF16
  __cpuid_count(7, 1, a, b, c, d);
  r.avx512 = avx512_state && avx512f && ((a >> 5) & 1);  // AVX512_BF16
  return r;
}

const Bf16& features() {
  static const Bf16 f = detect();
  return f;
}

}  // namespace

bool cpu_has_native_bf16() { return features().avx512 || features().amx; }

std::string cpu_bf16_instructions() {
  const auto& f = features();
  if (f.avx512 && f.amx) return "AVX512_BF16, AMX-BF16";
  if (f.avx512) return "AVX512_BF16";
  if (f.amx) return "AMX-BF16";
  return "none";
}

const CpuVectorFeatures& cpu_vector_features() {
  static const CpuVectorFeatures f = [] {
    CpuVectorFeatures v;
#if defined(__x86_64__)
    v.sse42 = __builtin_cpu_supports("sse4.2");
    v.pclmul = v.sse42 && __builtin_cpu_supports("pclmul");
    v.avx2 = __builtin_cpu_supports("avx2");
    v.avx512_vpclmul = v.pclmul && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512vl") &&
                       __builtin_cpu_supports("vpclmulqdq");
#endif
    return v;
  }();
  return f;
}

void require_cpu_bf16(const std::string& flag) {
  if (cpu_has_native_bf16()) return;
  throw Error(flag + " bf16 on the CPU needs native bf16 instructions (AVX512_BF16 or AMX-BF16), and this CPU has "
                     "neither (or the OS does not enable their register state); emulated bf16 would run slower than fp32",
              "use " + flag + " fp32 on this machine");
}

}  // namespace convnets
