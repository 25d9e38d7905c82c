#include "io/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
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

bool has_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

std::uint32_t crc32c_portable(const void* data, std::size_t size, std::uint32_t crc) {
  return ~raw_portable(static_cast<const unsigned char*>(data), size, ~crc);
}

std::uint32_t crc32c(const void* data, std::size_t size, std::uint32_t crc) {
#if defined(__x86_64__)
  if (has_sse42()) return ~raw_sse42(static_cast<const unsigned char*>(data), size, ~crc);
#endif
  return crc32c_portable(data, size, crc);
}

}  // namespace convnets
