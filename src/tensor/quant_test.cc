// Tests of DType helpers, the scalar f16/bf16 conversions and Q8_0/Q4_0 quantization.
#include "tensor/quant.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/fp16.h"

namespace kvllm {
namespace {

constexpr DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};

float Bits(uint32_t b) { return std::bit_cast<float>(b); }

TEST(DTypeTest, NamesRoundTrip) {
  EXPECT_STREQ(DTypeName(DType::kF32), "f32");
  EXPECT_STREQ(DTypeName(DType::kF16), "f16");
  EXPECT_STREQ(DTypeName(DType::kBF16), "bf16");
  EXPECT_STREQ(DTypeName(DType::kQ8_0), "q8_0");
  EXPECT_STREQ(DTypeName(DType::kQ4_0), "q4_0");
  for (DType t : kAllTypes) EXPECT_EQ(DTypeFromName(DTypeName(t)), t);
  EXPECT_EQ(DTypeFromName("q4_1"), std::nullopt);
  EXPECT_EQ(DTypeFromName(""), std::nullopt);
}

TEST(DTypeTest, GgmlNumbers) {
  EXPECT_EQ(DTypeFromGgml(0), DType::kF32);
  EXPECT_EQ(DTypeFromGgml(1), DType::kF16);
  EXPECT_EQ(DTypeFromGgml(2), DType::kQ4_0);
  EXPECT_EQ(DTypeFromGgml(8), DType::kQ8_0);
  EXPECT_EQ(DTypeFromGgml(30), DType::kBF16);
  for (uint32_t unsupported : {3u, 6u, 7u, 12u, 29u, 31u, 1000u}) {
    EXPECT_EQ(DTypeFromGgml(unsupported), std::nullopt) << unsupported;
  }
}

TEST(DTypeTest, Sizes) {
  EXPECT_EQ(BlockElems(DType::kF32), 1);
  EXPECT_EQ(BlockElems(DType::kQ8_0), 32);
  EXPECT_EQ(BlockElems(DType::kQ4_0), 32);
  EXPECT_EQ(BlockBytes(DType::kF32), 4u);
  EXPECT_EQ(BlockBytes(DType::kF16), 2u);
  EXPECT_EQ(BlockBytes(DType::kBF16), 2u);
  EXPECT_EQ(BlockBytes(DType::kQ8_0), 34u);
  EXPECT_EQ(BlockBytes(DType::kQ4_0), 18u);
  EXPECT_EQ(RowBytes(DType::kF16, 7), 14u);
  EXPECT_EQ(RowBytes(DType::kQ8_0, 4096), 128u * 34);
  EXPECT_EQ(RowBytes(DType::kQ4_0, 64), 36u);
}

TEST(Fp16Test, EveryHalfRoundTrips) {
  for (uint32_t h = 0; h <= 0xffff; ++h) {
    const float f = F16ToF32(static_cast<uint16_t>(h));
    const uint16_t back = F32ToF16(f);
    const bool is_nan = (h & 0x7c00) == 0x7c00 && (h & 0x3ff) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(f)) << h;
      EXPECT_TRUE((back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0) << h;
      EXPECT_EQ(back & 0x8000, h & 0x8000) << h;
    } else {
      EXPECT_EQ(back, h) << h;
    }
  }
}

TEST(Fp16Test, KnownValues) {
  EXPECT_EQ(F16ToF32(0x3c00), 1.0f);
  EXPECT_EQ(F16ToF32(0xc000), -2.0f);
  EXPECT_EQ(F16ToF32(0x7bff), 65504.0f);
  EXPECT_EQ(F16ToF32(0x0001), 0x1p-24f);  // smallest subnormal
  EXPECT_EQ(F16ToF32(0x03ff), 1023 * 0x1p-24f);
  EXPECT_EQ(F16ToF32(0x0400), 0x1p-14f);  // smallest normal
  EXPECT_EQ(F16ToF32(0x7c00), std::numeric_limits<float>::infinity());
  EXPECT_EQ(F16ToF32(0xfc00), -std::numeric_limits<float>::infinity());
  EXPECT_TRUE(std::signbit(F16ToF32(0x8000)));
}

TEST(Fp16Test, RoundsToNearestEven) {
  // 1 + 2^-11 is halfway between 1 and 1 + 2^-10: ties to the even mantissa (1.0).
  EXPECT_EQ(F32ToF16(1.0f + 0x1p-11f), 0x3c00);
  // 1 + 3 * 2^-11 is halfway between 1 + 2^-10 (odd) and 1 + 2^-9 (even).
  EXPECT_EQ(F32ToF16(1.0f + 3 * 0x1p-11f), 0x3c02);
  // Just above the halfway point rounds up.
  EXPECT_EQ(F32ToF16(std::nextafter(1.0f + 0x1p-11f, 2.0f)), 0x3c01);
  EXPECT_EQ(F32ToF16(std::nextafter(1.0f + 0x1p-11f, 0.0f)), 0x3c00);
  // Rounding carries into the exponent: 2 - 2^-12 is above the last half below 2.
  EXPECT_EQ(F32ToF16(2.0f - 0x1p-12f), 0x4000);
  EXPECT_EQ(F32ToF16(-1.0f), 0xbc00);
}

TEST(Fp16Test, OverflowAndSpecials) {
  EXPECT_EQ(F32ToF16(65504.0f), 0x7bff);
  EXPECT_EQ(F32ToF16(65519.0f), 0x7bff);  // below the halfway point to 2^16
  EXPECT_EQ(F32ToF16(65520.0f), 0x7c00);  // halfway: ties to even, which is inf
  EXPECT_EQ(F32ToF16(1e10f), 0x7c00);
  EXPECT_EQ(F32ToF16(-1e10f), 0xfc00);
  EXPECT_EQ(F32ToF16(std::numeric_limits<float>::infinity()), 0x7c00);
  EXPECT_EQ(F32ToF16(-std::numeric_limits<float>::infinity()), 0xfc00);
  const uint16_t nan = F32ToF16(std::numeric_limits<float>::quiet_NaN());
  EXPECT_EQ(nan & 0x7c00, 0x7c00);
  EXPECT_NE(nan & 0x3ff, 0);
  // A NaN whose payload lies only in the low f32 bits must not turn into inf.
  const uint16_t low_payload = F32ToF16(Bits(0x7f800001u));
  EXPECT_NE(low_payload & 0x3ff, 0);
  EXPECT_EQ(F32ToF16(-0.0f), 0x8000);
}

TEST(Fp16Test, Subnormals) {
  EXPECT_EQ(F32ToF16(0x1p-24f), 0x0001);
  EXPECT_EQ(F32ToF16(0x1p-25f), 0x0000);                        // tie to even zero
  EXPECT_EQ(F32ToF16(std::nextafter(0x1p-25f, 1.0f)), 0x0001);  // above the tie
  EXPECT_EQ(F32ToF16(-0x1p-26f), 0x8000);                       // underflows to -0
  EXPECT_EQ(F32ToF16(3 * 0x1p-25f), 0x0002);                    // 1.5 ulp ties to even 2
  EXPECT_EQ(F32ToF16(5 * 0x1p-25f), 0x0002);                    // 2.5 ulp ties to even 2
  EXPECT_EQ(F32ToF16(1023.5f * 0x1p-24f), 0x0400);              // rounds up to normal
  EXPECT_EQ(F32ToF16(0x1p-14f - 0x1p-30f), 0x0400);
  EXPECT_EQ(F32ToF16(1e-45f), 0x0000);              // f32 subnormal input
  EXPECT_EQ(F32ToF16(-100.5f * 0x1p-24f), 0x8064);  // 100.5 ties to 100
}

TEST(Bf16Test, EveryBf16RoundTrips) {
  for (uint32_t b = 0; b <= 0xffff; ++b) {
    const float f = BF16ToF32(static_cast<uint16_t>(b));
    EXPECT_EQ(std::bit_cast<uint32_t>(f), b << 16);
    const uint16_t back = F32ToBF16(f);
    const bool is_nan = (b & 0x7f80) == 0x7f80 && (b & 0x7f) != 0;
    if (is_nan) {
      EXPECT_TRUE(std::isnan(BF16ToF32(back))) << b;
      EXPECT_EQ(back & 0x8000, b & 0x8000) << b;
    } else {
      EXPECT_EQ(back, b) << b;
    }
  }
}

TEST(Bf16Test, Rounding) {
  // bf16 keeps 7 mantissa bits: 1 + 2^-8 ties to 1, 1 + 3 * 2^-8 ties to 1 + 2^-6.
  EXPECT_EQ(F32ToBF16(1.0f + 0x1p-8f), 0x3f80);
  EXPECT_EQ(F32ToBF16(1.0f + 3 * 0x1p-8f), 0x3f82);
  EXPECT_EQ(F32ToBF16(std::nextafter(1.0f + 0x1p-8f, 2.0f)), 0x3f81);
  // The largest finite f32 rounds up to inf; the largest bf16 stays.
  EXPECT_EQ(F32ToBF16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(F32ToBF16(Bits(0x7f7f0000u)), 0x7f7f);
  EXPECT_EQ(F32ToBF16(-std::numeric_limits<float>::infinity()), 0xff80);
  // Subnormals round like everything else.
  EXPECT_EQ(F32ToBF16(Bits(0x00018000u)), 0x0002);  // tie, odd 1 -> even 2
  EXPECT_EQ(F32ToBF16(Bits(0x00008000u)), 0x0000);  // tie, even 0 stays
  // A NaN with only low payload bits stays NaN.
  EXPECT_TRUE(std::isnan(BF16ToF32(F32ToBF16(Bits(0x7f800001u)))));
}

// --- Q8_0 / Q4_0 -------------------------------------------------------------------------

TEST(QuantTest, Q8_0BlockDequantizes) {
  BlockQ8_0 b;
  b.d = F32ToF16(0.5f);
  for (int j = 0; j < kQK; ++j) b.qs[j] = static_cast<int8_t>(j * 8 - 128);  // -128 .. 120
  float y[kQK];
  DequantizeRow(DType::kQ8_0, &b, y, kQK);
  for (int j = 0; j < kQK; ++j) EXPECT_EQ(y[j], 0.5f * (j * 8 - 128)) << j;
}

TEST(QuantTest, Q4_0BlockDequantizesInNibbleOrder) {
  BlockQ4_0 b;
  b.d = F32ToF16(0.25f);
  // Byte j: element j in the low nibble, element j + 16 in the high nibble.
  for (int j = 0; j < 16; ++j) b.qs[j] = static_cast<uint8_t>(j | ((15 - j) << 4));
  float y[kQK];
  DequantizeRow(DType::kQ4_0, &b, y, kQK);
  for (int j = 0; j < 16; ++j) {
    EXPECT_EQ(y[j], 0.25f * (j - 8)) << j;
    EXPECT_EQ(y[j + 16], 0.25f * (7 - j)) << j;
  }
}

TEST(QuantTest, Q8_0KnownQuantization) {
  float x[kQK] = {};
  x[0] = 127.0f;  // d = 1
  x[1] = -127.0f;
  x[2] = 2.5f;  // rounds half away from zero
  x[3] = -2.5f;
  x[4] = 0.4f;
  BlockQ8_0 b;
  QuantizeRow(DType::kQ8_0, x, &b, kQK);
  EXPECT_EQ(F16ToF32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 127);
  EXPECT_EQ(b.qs[1], -127);
  EXPECT_EQ(b.qs[2], 3);
  EXPECT_EQ(b.qs[3], -3);
  EXPECT_EQ(b.qs[4], 0);
  EXPECT_EQ(b.qs[5], 0);
}

TEST(QuantTest, Q4_0KnownQuantization) {
  float x[kQK] = {};
  x[0] = -8.0f;  // the largest magnitude, negative: d = -8 / -8 = 1
  x[1] = 7.0f;
  x[16] = 3.0f;
  x[17] = -2.5f;  // + 8.5 = 6.0 -> 6, i.e. -2 (halves round up)
  BlockQ4_0 b;
  QuantizeRow(DType::kQ4_0, x, &b, kQK);
  EXPECT_EQ(F16ToF32(b.d), 1.0f);
  EXPECT_EQ(b.qs[0], 0x0 | (0xb << 4));  // -8 -> 0, 3 -> 11
  EXPECT_EQ(b.qs[1], 0xf | (0x6 << 4));  // 7 -> 15, -2.5 -> 6
  EXPECT_EQ(b.qs[2], 0x88);              // zeros -> 8

  // A positive maximum gives a negative scale; it maps to q = 0 and the other sign clamps.
  float y[kQK] = {};
  y[0] = 8.0f;
  y[1] = -8.0f;
  QuantizeRow(DType::kQ4_0, y, &b, kQK);
  EXPECT_EQ(F16ToF32(b.d), -1.0f);
  EXPECT_EQ(b.qs[0] & 0xf, 0);
  EXPECT_EQ(b.qs[1] & 0xf, 15);  // 16 clamped to 15: -1 * (15 - 8) = -7
}

TEST(QuantTest, AllZeroBlocks) {
  const float zeros[kQK] = {};
  for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
    std::vector<uint8_t> row(RowBytes(t, kQK));
    QuantizeRow(t, zeros, row.data(), kQK);
    float y[kQK];
    DequantizeRow(t, row.data(), y, kQK);
    for (float v : y) EXPECT_EQ(v, 0.0f) << DTypeName(t);
  }
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed, float scale) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-scale, scale);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

TEST(QuantTest, RoundTripErrorBounds) {
  constexpr int64_t kN = 32 * 64;
  for (float scale : {1e-3f, 1.0f, 300.0f}) {
    const std::vector<float> x = RandomFloats(kN, 7, scale);
    for (DType t : kAllTypes) {
      std::vector<uint8_t> row(RowBytes(t, kN));
      std::vector<float> y(kN);
      QuantizeRow(t, x.data(), row.data(), kN);
      DequantizeRow(t, row.data(), y.data(), kN);
      for (int64_t b = 0; b < kN / kQK; ++b) {
        float amax = 0.0f;
        for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[b * kQK + j]));
        for (int j = 0; j < kQK; ++j) {
          const int64_t i = b * kQK + j;
          const float err = std::fabs(y[i] - x[i]);
          switch (t) {
            case DType::kF32:
              EXPECT_EQ(y[i], x[i]);
              break;
            case DType::kF16:  // half an ulp of an 11-bit significand, or of a subnormal
              EXPECT_LE(err, std::max(std::fabs(x[i]) * 0x1p-11f, 0x1p-25f)) << i;
              break;
            case DType::kBF16:  // half an ulp of an 8-bit significand
              EXPECT_LE(err, std::fabs(x[i]) * 0x1p-8f) << i;
              break;
            case DType::kQ8_0: {
              // Half a step of d = amax / 127, plus |q| <= 127 times the error of storing d
              // as f16 (absolute, not relative, once d is an f16 subnormal).
              const float d = amax / 127;
              const float d_err = std::fabs(F16ToF32(F32ToF16(d)) - d);
              EXPECT_LE(err, (0.5f * d + 127 * d_err) * 1.0001f) << i;
              break;
            }
            case DType::kQ4_0: {
              // As Q8_0 with d = amax / 8 and |q - 8| <= 8, except a full step where the
              // value opposite the signed maximum clamps from q = 16 to 15.
              const float d = amax / 8;
              const float d_err = std::fabs(F16ToF32(F32ToF16(d)) - d);
              const float steps = std::fabs(x[i]) > amax * 7.5f / 8 ? 1.0f : 0.5f;
              EXPECT_LE(err, (steps * d + 8 * d_err) * 1.0001f) << i;
              break;
            }
          }
        }
      }
    }
  }
}

TEST(QuantTest, FloatRowsMatchScalarConversions) {
  const std::vector<float> x = {1.0f, -0.0f, 1.0f + 0x1p-11f, 65520.0f, 3e-6f, -1e30f, 0.1f};
  std::vector<uint16_t> h(x.size());
  std::vector<uint16_t> b(x.size());
  QuantizeRow(DType::kF16, x.data(), h.data(), static_cast<int64_t>(x.size()));
  QuantizeRow(DType::kBF16, x.data(), b.data(), static_cast<int64_t>(x.size()));
  std::vector<float> hy(x.size());
  std::vector<float> by(x.size());
  DequantizeRow(DType::kF16, h.data(), hy.data(), static_cast<int64_t>(x.size()));
  DequantizeRow(DType::kBF16, b.data(), by.data(), static_cast<int64_t>(x.size()));
  for (size_t i = 0; i < x.size(); ++i) {
    EXPECT_EQ(h[i], F32ToF16(x[i])) << i;
    EXPECT_EQ(b[i], F32ToBF16(x[i])) << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(hy[i]), std::bit_cast<uint32_t>(F16ToF32(h[i]))) << i;
    EXPECT_EQ(std::bit_cast<uint32_t>(by[i]), std::bit_cast<uint32_t>(BF16ToF32(b[i]))) << i;
  }
  EXPECT_EQ(h[3], 0x7c00);  // overflow to inf
  EXPECT_EQ(b[0], 0x3f80);
}


TEST(QuantTest, ActCodeSumsAddEachBlocksCodes) {
  std::vector<BlockQ8Act> xq(3);
  for (int b = 0; b < 3; ++b) {
    for (int j = 0; j < kQK; ++j) xq[b].qs[j] = static_cast<int8_t>(b == 1 ? -127 : j - b);
  }
  std::vector<int32_t> sums(4, 7);
  ActCodeSums(xq.data(), 3, sums.data());
  EXPECT_EQ(sums, (std::vector<int32_t>{496, -127 * kQK, 496 - 2 * kQK, 7}));
}

// A group's blocks fill its bytes exactly once, scales then qs per pair, and with an even
// count (or before the last block of an odd one) every 64-byte row of qs is one cache line.
TEST(InterleaveTest, PairedBlocksTileTheGroupWithAlignedRows) {
  for (int64_t block_bytes : {sizeof(BlockQ4_0x16), sizeof(BlockQ8_0x16)}) {
    for (int64_t nb : {1, 2, 3, 64, 65}) {
      const Interleaved16Layout layout{nb, block_bytes};
      std::vector<int> uses(layout.GroupBytes());
      for (int64_t b = 0; b < nb; ++b) {
        const int64_t d = layout.ScaleOffset(b), qs = layout.QsOffset(b);
        for (int64_t i = 0; i < Interleaved16Layout::kScaleBytes; ++i) ++uses.at(d + i);
        for (int64_t i = 0; i < block_bytes - Interleaved16Layout::kScaleBytes; ++i) {
          ++uses.at(qs + i);
        }
        if (b + 1 < nb || nb % 2 == 0) {
          EXPECT_EQ(qs % 64, 0) << "block " << b << " of " << nb;
        }
      }
      EXPECT_EQ(std::count(uses.begin(), uses.end(), 1), layout.GroupBytes())
          << block_bytes << " bytes a block, " << nb << " blocks";
    }
  }
}

// A float group's chunk order is a permutation that PositionOf inverts, strided wherever the
// count allows: chunk counts of 1 and 2, divisors of 16 (17 would leave 1: stride 19),
// multiples of 17 (stride 19) and of 17 x 19 (stride 23), TinyLlama's 64 and 176.
TEST(InterleaveTest, FloatChunkOrderIsAStridedPermutation) {
  for (int64_t n_chunks : {1, 2, 3, 4, 8, 16, 17, 34, 64, 65, 176, 323, 646, 1000}) {
    const FloatChunkOrder order(n_chunks);
    std::vector<int> seen(n_chunks);
    for (int64_t i = 0; i < n_chunks; ++i) {
      const int64_t c = order.ChunkAt(i);
      ASSERT_GE(c, 0);
      ASSERT_LT(c, n_chunks);
      ++seen[c];
      EXPECT_EQ(order.PositionOf(c), i) << n_chunks << " chunks, position " << i;
    }
    EXPECT_EQ(std::count(seen.begin(), seen.end(), 1), n_chunks) << n_chunks << " chunks";
    if (n_chunks > 2) {
      EXPECT_GT(order.stride, 1) << n_chunks << " chunks";
    }
  }
  EXPECT_EQ(FloatChunkOrder(64).stride, 17);
  EXPECT_EQ(FloatChunkOrder(16).stride, 3);  // 19 mod 16
  EXPECT_EQ(FloatChunkOrder(34).stride, 19);
  EXPECT_EQ(FloatChunkOrder(646).stride, 23);
}

// InterleaveRows puts row r of group g, columns 32c .. 32c + 31, at the chunk's position in
// the group, [row][32] within it (F16 and BF16 alike: bits are copied).
TEST(InterleaveTest, FloatRowsLieWhereTheChunkOrderSays) {
  constexpr int64_t kOut = 32, kIn = 96;  // 2 groups of 3 chunks
  std::vector<uint16_t> rows(kOut * kIn);
  for (size_t i = 0; i < rows.size(); ++i) rows[i] = static_cast<uint16_t>(i);
  for (DType t : {DType::kF16, DType::kBF16}) {
    std::vector<uint16_t> out(rows.size());
    InterleaveRows(t, rows.data(), kOut, kIn, out.data());
    const FloatChunkOrder order(kIn / kQK);
    for (int64_t o = 0; o < kOut; ++o) {
      for (int64_t j = 0; j < kIn; ++j) {
        const int64_t g = o / 16, r = o % 16, c = j / kQK;
        const int64_t at = ((g * order.n_chunks + order.PositionOf(c)) * 16 + r) * kQK + j % kQK;
        ASSERT_EQ(out[at], rows[o * kIn + j]) << DTypeName(t) << " row " << o << " col " << j;
      }
    }
  }
}

}  // namespace
}  // namespace kvllm
