#include "core/crc32c.h"

#include "core/cpu_features.h"

#include <cstring>
#include <initializer_list>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace convnets {
namespace {

constexpr std::uint32_t kPolynomial = 0x82F63B78u;  // Castagnoli's, bit-reflected (RFC 3720, B.4)

// Slicing-by-8: row 0 is the byte-at-a-time table, row k the same byte followed by k zero bytes, so eight
// lookups advance the register by a whole word.
struct Tables {
  std::uint32_t row[8][256];
};

const Tables& tables() {
  static const Tables t = [] {
    Tables x{};
    for (std::uint32_t b = 0; b < 256; ++b) {
      std::uint32_t c = b;
      for (int i = 0; i < 8; ++i) c = (c >> 1) ^ (kPolynomial & (0u - (c & 1u)));
      x.row[0][b] = c;
    }
    for (int k = 1; k < 8; ++k) {
      for (std::uint32_t b = 0; b < 256; ++b) x.row[k][b] = (x.row[k - 1][b] >> 8) ^ x.row[0][x.row[k - 1][b] & 0xff];
    }
    return x;
  }();
  return t;
}

// The register form (no inversion at either end): crc32c(data, c) == ~raw(data, ~c). Linear in the register,
// which is what lets three streams be combined below.
std::uint32_t raw_portable(const unsigned char* p, std::size_t n, std::uint32_t c) {
  const auto& r = tables().row;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t w;
    std::memcpy(&w, p, 8);  // little-endian: the first byte is the lowest
    w ^= c;
    c = r[7][w & 0xff] ^ r[6][(w >> 8) & 0xff] ^ r[5][(w >> 16) & 0xff] ^ r[4][(w >> 24) & 0xff] ^
        r[3][(w >> 32) & 0xff] ^ r[2][(w >> 40) & 0xff] ^ r[1][(w >> 48) & 0xff] ^ r[0][w >> 56];
  }
  for (; n > 0; --n) c = (c >> 8) ^ r[0][(c ^ *p++) & 0xff];
  return c;
}

#if defined(__x86_64__)
// The crc32 instruction has a latency of three cycles and a throughput of one: three independent streams over
// consecutive lanes keep it busy, and their registers are joined by advancing each past the lanes after it.
constexpr std::size_t kLane = 4096;

// Advancing a register over kLane zero bytes is linear in its 32 bits: four tables of a byte each.
struct LaneShift {
  std::uint32_t byte[4][256];
};

const LaneShift& lane_shift() {
  static const LaneShift s = [] {
    static const unsigned char zeros[kLane] = {};
    std::uint32_t bit[32];
    for (int i = 0; i < 32; ++i) bit[i] = raw_portable(zeros, kLane, 1u << i);
    LaneShift x{};
    for (int k = 0; k < 4; ++k) {
      for (std::uint32_t b = 0; b < 256; ++b) {
        std::uint32_t v = 0;
        for (int i = 0; i < 8; ++i) {
          if ((b >> i) & 1u) v ^= bit[8 * k + i];
        }
        x.byte[k][b] = v;
      }
    }
    return x;
  }();
  return s;
}

std::uint32_t past_lane(std::uint32_t c) {
  const auto& t = lane_shift().byte;
  return t[0][c & 0xff] ^ t[1][(c >> 8) & 0xff] ^ t[2][(c >> 16) & 0xff] ^ t[3][c >> 24];
}

__attribute__((target("sse4.2"))) std::uint32_t raw_sse42(const unsigned char* p, std::size_t n, std::uint32_t c) {
  for (; n >= 3 * kLane; p += 3 * kLane, n -= 3 * kLane) {
    std::uint64_t c0 = c, c1 = 0, c2 = 0;
    for (std::size_t i = 0; i < kLane; i += 8) {
      std::uint64_t a, b, d;
      std::memcpy(&a, p + i, 8);
      std::memcpy(&b, p + kLane + i, 8);
      std::memcpy(&d, p + 2 * kLane + i, 8);
      c0 = _mm_crc32_u64(c0, a);
      c1 = _mm_crc32_u64(c1, b);
      c2 = _mm_crc32_u64(c2, d);
    }
    // raw(A B C, c) = past(past(raw(A, c)) ^ raw(B, 0)) ^ raw(C, 0)
    c = past_lane(past_lane(static_cast<std::uint32_t>(c0)) ^ static_cast<std::uint32_t>(c1)) ^
        static_cast<std::uint32_t>(c2);
  }
  std::uint64_t c64 = c;
  for (; n >= 8; p += 8, n -= 8) {
    std::uint64_t a;
    std::memcpy(&a, p, 8);
    c64 = _mm_crc32_u64(c64, a);
  }
  c = static_cast<std::uint32_t>(c64);
  for (; n > 0; --n) c = _mm_crc32_u8(c, *p++);
  return c;
}

// Folding (Gopal et al., "Fast CRC Computation for Generic Polynomials Using PCLMULQDQ Instruction", Intel 2009):
// a 128-bit block V = A x^64 + B moved D bits on is A (x^(D+32) mod P) x^32 + B (x^(D-32) mod P) x^32 modulo P,
// two carry-less products of 64 x 33 bits. Blocks are folded onto the ones D bits later until one 128-bit
// remainder is left, whose CRC the crc32 instruction takes with the tail: it is congruent to everything before.
// The constants, reflected as the data are and shifted left once for the product's 127 bits.
std::uint64_t fold_constant(int exponent) {
  std::uint64_t v = 1;  // x^exponent mod P, P = 0x1EDC6F41 with its x^32
  for (int i = 0; i < exponent; ++i) {
    v <<= 1;
    if (v & (std::uint64_t{1} << 32)) v ^= 0x11EDC6F41ull;
  }
  std::uint64_t reflected = 0;
  for (int i = 0; i < 32; ++i) reflected |= ((v >> i) & 1u) << (31 - i);
  return reflected << 1;
}

// {x^(D+32), x^(D-32)} for a fold over D bits: lo multiplies A (the block's first 8 bytes), hi multiplies B.
struct FoldConstants {
  std::uint64_t lo, hi;
  explicit FoldConstants(int bits) : lo(fold_constant(bits + 32)), hi(fold_constant(bits - 32)) {}
};

const FoldConstants& fold_by(int bits) {
  static const FoldConstants f128(128), f512(512), f2048(2048);
  return bits == 128 ? f128 : bits == 512 ? f512 : f2048;
}

__attribute__((target("pclmul,sse4.2"))) inline __m128i fold128(__m128i v, __m128i k) {
  return _mm_xor_si128(_mm_clmulepi64_si128(v, k, 0x00), _mm_clmulepi64_si128(v, k, 0x11));
}

__attribute__((target("pclmul,sse4.2"))) __m128i constants128(int bits) {
  const auto& f = fold_by(bits);
  return _mm_set_epi64x(static_cast<long long>(f.hi), static_cast<long long>(f.lo));
}

// The remainder r, then the whole 16-byte blocks left, folded; its CRC and the tail's through crc32.
__attribute__((target("pclmul,sse4.2"))) std::uint32_t finish128(__m128i r, const unsigned char* p, std::size_t n) {
  const __m128i k = constants128(128);
  for (; n >= 16; p += 16, n -= 16) r = _mm_xor_si128(fold128(r, k), _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  std::uint64_t c = _mm_crc32_u64(0, static_cast<std::uint64_t>(_mm_cvtsi128_si64(r)));
  c = _mm_crc32_u64(c, static_cast<std::uint64_t>(_mm_extract_epi64(r, 1)));
  return raw_sse42(p, n, static_cast<std::uint32_t>(c));
}

// The bytes after a fold's last whole round, copied to `d` when there is one: the CRC reads them from `p`.
inline void copy_rest(unsigned char* d, const unsigned char* p, std::size_t n) {
  if (d != nullptr) std::memcpy(d, p, n);
}

// The block at `at`, stored at the same offset of `d` when there is one.
__attribute__((target("pclmul,sse4.2"))) inline __m128i load_copy128(const unsigned char* p, unsigned char* d,
                                                                     std::size_t at) {
  const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + at));
  if (d != nullptr) _mm_storeu_si128(reinterpret_cast<__m128i*>(d + at), v);
  return v;
}

// Four 128-bit lanes, 64 bytes a round. With `d`, each block is also stored there once it is in a register: a
// copy and its checksum in one pass over memory, the folds hidden under the stores.
__attribute__((target("pclmul,sse4.2"))) std::uint32_t raw_pclmul(const unsigned char* p, std::size_t n,
                                                                   std::uint32_t c, unsigned char* d = nullptr) {
  if (n < 64) {
    copy_rest(d, p, n);
    return raw_sse42(p, n, c);
  }
  __m128i x0 = _mm_xor_si128(load_copy128(p, d, 0), _mm_cvtsi32_si128(static_cast<int>(c)));
  __m128i x1 = load_copy128(p, d, 16), x2 = load_copy128(p, d, 32), x3 = load_copy128(p, d, 48);
  const __m128i k = constants128(512);
  const auto advance = [&] {
    p += 64, n -= 64;
    if (d != nullptr) d += 64;
  };
  for (advance(); n >= 64; advance()) {
    x0 = _mm_xor_si128(fold128(x0, k), load_copy128(p, d, 0));
    x1 = _mm_xor_si128(fold128(x1, k), load_copy128(p, d, 16));
    x2 = _mm_xor_si128(fold128(x2, k), load_copy128(p, d, 32));
    x3 = _mm_xor_si128(fold128(x3, k), load_copy128(p, d, 48));
  }
  copy_rest(d, p, n);
  const __m128i k1 = constants128(128);
  x1 = _mm_xor_si128(x1, fold128(x0, k1));
  x2 = _mm_xor_si128(x2, fold128(x1, k1));
  x3 = _mm_xor_si128(x3, fold128(x2, k1));
  return finish128(x3, p, n);
}

#define CONVNETS_AVX512_FOLD __attribute__((target("avx512f,avx512vl,vpclmulqdq,pclmul,sse4.2")))
// GCC 12's avx512fintrin.h initialises its "undefined" vectors from themselves, which -Wmaybe-uninitialized
// reports in every function that inlines them.
#if !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif

CONVNETS_AVX512_FOLD inline __m512i fold(__m512i v, __m512i k) {
  return _mm512_xor_si512(_mm512_clmulepi64_epi128(v, k, 0x00), _mm512_clmulepi64_epi128(v, k, 0x11));
}

CONVNETS_AVX512_FOLD inline __m512i load_copy512(const unsigned char* p, unsigned char* d, std::size_t at) {
  const __m512i v = _mm512_loadu_si512(p + at);
  if (d != nullptr) _mm512_storeu_si512(d + at, v);
  return v;
}

// The same on four 512-bit registers of four blocks each (AVX-512's VPCLMULQDQ), 256 bytes a round, and the same
// copy to `d`.
CONVNETS_AVX512_FOLD std::uint32_t raw_vpclmul(const unsigned char* p, std::size_t n, std::uint32_t c,
                                               unsigned char* d = nullptr) {
  if (n < 256) return raw_pclmul(p, n, c, d);
  const __m512i c512 = _mm512_zextsi128_si512(_mm_cvtsi32_si128(static_cast<int>(c)));
  __m512i z0 = _mm512_xor_si512(load_copy512(p, d, 0), c512);
  __m512i z1 = load_copy512(p, d, 64), z2 = load_copy512(p, d, 128), z3 = load_copy512(p, d, 192);
  const __m512i k = _mm512_broadcast_i32x4(constants128(2048));
  const auto advance = [&] {
    p += 256, n -= 256;
    if (d != nullptr) d += 256;
  };
  for (advance(); n >= 256; advance()) {
    z0 = _mm512_xor_si512(fold(z0, k), load_copy512(p, d, 0));
    z1 = _mm512_xor_si512(fold(z1, k), load_copy512(p, d, 64));
    z2 = _mm512_xor_si512(fold(z2, k), load_copy512(p, d, 128));
    z3 = _mm512_xor_si512(fold(z3, k), load_copy512(p, d, 192));
  }
  copy_rest(d, p, n);
  const __m512i k4 = _mm512_broadcast_i32x4(constants128(512));
  z1 = _mm512_xor_si512(z1, fold(z0, k4));
  z2 = _mm512_xor_si512(z2, fold(z1, k4));
  z3 = _mm512_xor_si512(z3, fold(z2, k4));
  // z3's four blocks are consecutive: each folded onto the next.
  const __m128i k1 = constants128(128);
  __m128i r = _mm512_extracti32x4_epi32(z3, 0);
  r = _mm_xor_si128(fold128(r, k1), _mm512_extracti32x4_epi32(z3, 1));
  r = _mm_xor_si128(fold128(r, k1), _mm512_extracti32x4_epi32(z3, 2));
  r = _mm_xor_si128(fold128(r, k1), _mm512_extracti32x4_epi32(z3, 3));
  return finish128(r, p, n);
}
#if !defined(__clang__)
#pragma GCC diagnostic pop
#endif
#endif

bool available(Crc32cPath path) {
  const auto& cpu = cpu_vector_features();
  switch (path) {
    case Crc32cPath::Vpclmul512: return cpu.avx512_vpclmul;
    case Crc32cPath::Pclmul: return cpu.pclmul;
    case Crc32cPath::Sse42: return cpu.sse42;
    case Crc32cPath::Table: return true;
  }
  return false;
}

// With `d`, the bytes are also copied there: in the same pass where the path folds, before it otherwise.
std::uint32_t raw_on(Crc32cPath path, const unsigned char* p, std::size_t n, std::uint32_t c,
                     unsigned char* d = nullptr) {
#if defined(__x86_64__)
  switch (path) {
    case Crc32cPath::Vpclmul512: return raw_vpclmul(p, n, c, d);
    case Crc32cPath::Pclmul: return raw_pclmul(p, n, c, d);
    case Crc32cPath::Sse42: copy_rest(d, p, n); return raw_sse42(p, n, c);
    case Crc32cPath::Table: break;
  }
#endif
  (void)path;
  if (d != nullptr) std::memcpy(d, p, n);
  return raw_portable(p, n, c);
}

Crc32cPath best_path() {
  static const Crc32cPath best = [] {
    for (auto path : {Crc32cPath::Vpclmul512, Crc32cPath::Pclmul, Crc32cPath::Sse42}) {
      if (available(path)) return path;
    }
    return Crc32cPath::Table;
  }();
  return best;
}

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc) {
  return ~raw_portable(static_cast<const unsigned char*>(data), size, ~crc);
}

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
  return ~raw_on(best_path(), static_cast<const unsigned char*>(data), size, ~crc);
}

std::uint32_t crc32c_copy(void* destination, const void* source, std::size_t size, std::uint32_t crc) {
  return ~raw_on(best_path(), static_cast<const unsigned char*>(source), size, ~crc,
                 static_cast<unsigned char*>(destination));
}

bool crc32c_available(Crc32cPath path) { return available(path); }

std::uint32_t crc32c_on(Crc32cPath path, const void* data, std::size_t size, std::uint32_t crc) {
  if (!available(path)) path = Crc32cPath::Table;
  return ~raw_on(path, static_cast<const unsigned char*>(data), size, ~crc);
}

std::uint32_t crc32c_copy_on(Crc32cPath path, void* destination, const void* source, std::size_t size,
                             std::uint32_t crc) {
  if (!available(path)) path = Crc32cPath::Table;
  return ~raw_on(path, static_cast<const unsigned char*>(source), size, ~crc, static_cast<unsigned char*>(destination));
}

}  // namespace convnets
