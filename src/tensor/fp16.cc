#include "tensor/fp16.h"

#include <bit>

namespace kvllm {

namespace {

constexpr uint32_t kF32AbsMask = 0x7fffffffu;
constexpr uint32_t kF32Inf = 0x7f800000u;

}  // namespace

float F16ToF32(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exp = (h >> 10) & 0x1fu;
  const uint32_t mant = h & 0x3ffu;
  if (exp == 0) {
    // Zero or subnormal: mant * 2^-24 is exact in f32.
    const float magnitude = static_cast<float>(mant) * 0x1p-24f;
    return std::bit_cast<float>(std::bit_cast<uint32_t>(magnitude) | sign);
  }
  if (exp == 0x1f) {
    // Inf, or NaN with its payload kept in the top mantissa bits.
    return std::bit_cast<float>(sign | kF32Inf | (mant << 13));
  }
  // Rebias the exponent from 15 to 127.
  return std::bit_cast<float>(sign | ((exp + 112) << 23) | (mant << 13));
}

uint16_t F32ToF16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  const uint16_t sign = static_cast<uint16_t>((bits >> 16) & 0x8000u);
  const uint32_t x = bits & kF32AbsMask;
  if (x > kF32Inf) {
    // NaN: keep the top payload bits and force the quiet bit so the result cannot become inf.
    return static_cast<uint16_t>(sign | 0x7e00u | ((x >> 13) & 0x3ffu));
  }
  // 65520 (0x477ff000) is halfway between the largest half, 65504, and 2^16; the tie goes to
  // the even neighbour, which is inf.
  if (x >= 0x477ff000u) return static_cast<uint16_t>(sign | 0x7c00u);
  if (x >= 0x38800000u) {
    // Normal half. Adding 0xfff plus the lowest kept bit rounds to nearest even; a carry out
    // of the mantissa correctly bumps the exponent.
    const uint32_t odd = (x >> 13) & 1u;
    const uint32_t rounded = x + 0xfffu + odd;
    return static_cast<uint16_t>(sign | ((rounded - (112u << 23)) >> 13));
  }
  const uint32_t exp = x >> 23;
  // Below 2^-25 everything rounds to zero (2^-25 itself ties to the even value 0).
  if (exp < 102) return sign;
  // Subnormal half: the result mantissa is round(|f| * 2^24) = round(m * 2^(exp - 126)) for
  // the 24-bit significand m. It may round up to 0x400, the smallest normal, which is right.
  const uint32_t m = (x & 0x7fffffu) | 0x800000u;
  const uint32_t shift = 126 - exp;  // 14..24
  uint32_t q = m >> shift;
  const uint32_t rem = m & ((1u << shift) - 1);
  const uint32_t half = 1u << (shift - 1);
  if (rem > half || (rem == half && (q & 1u))) ++q;
  return static_cast<uint16_t>(sign | q);
}

float BF16ToF32(uint16_t b) { return std::bit_cast<float>(static_cast<uint32_t>(b) << 16); }

uint16_t F32ToBF16(float f) {
  const uint32_t bits = std::bit_cast<uint32_t>(f);
  if ((bits & kF32AbsMask) > kF32Inf) {
    // Truncating a NaN could clear every remaining mantissa bit; set the quiet bit.
    return static_cast<uint16_t>((bits >> 16) | 0x0040u);
  }
  // Same exponent range as f32, so subnormals and overflow to inf fall out of the rounding.
  const uint32_t odd = (bits >> 16) & 1u;
  return static_cast<uint16_t>((bits + 0x7fffu + odd) >> 16);
}

}  // namespace kvllm
