// KV formats: names, validation, the KIVI codecs and the Hadamard rotation, and every format's
// round trip through the cache (WriteK / WriteV, then ReadK / ReadV) within its stated bound.
#include "kv/kivi.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kv/hadamard.h"
#include "kv/kv_cache.h"
#include "kv/kv_format.h"
#include "tensor/fp16.h"

namespace kvllm {
namespace {

TEST(KVFormatTest, NamesRoundTrip) {
  std::vector<std::string> names;
  for (KVFormat f : KVFormat::All()) {
    names.push_back(f.name());
    EXPECT_EQ(KVFormat::FromName(f.name()), f);
  }
  EXPECT_EQ(names, (std::vector<std::string>{"f32", "f16", "bf16", "q8_0", "q4_0", "q4_0r", "k4",
                                              "k2"}));
  EXPECT_EQ(KVFormat::FromName("k3"), std::nullopt);
  EXPECT_EQ(KVFormat::FromName("q4_1"), std::nullopt);
  EXPECT_EQ(KVFormat(DType::kQ8_0), KVFormat::FromName("q8_0"));
  EXPECT_TRUE(KVFormat::Kivi(2).staged(KVRole::kK));
  EXPECT_FALSE(KVFormat::Kivi(2).staged(KVRole::kV));
  EXPECT_FALSE(KVFormat::RotatedQ4_0().staged(KVRole::kK));
}

TEST(KVFormatTest, ValidateNamesWhatIsWrong) {
  EXPECT_TRUE(KVFormat::RotatedQ4_0().Validate(KVRole::kK, 128).ok());
  Status v = KVFormat::RotatedQ4_0().Validate(KVRole::kV, 128);
  ASSERT_FALSE(v.ok());
  EXPECT_NE(v.message().find("K format"), std::string::npos) << v.message();
  Status pow2 = KVFormat::RotatedQ4_0().Validate(KVRole::kK, 96);
  ASSERT_FALSE(pow2.ok());
  EXPECT_NE(pow2.message().find("power of two"), std::string::npos) << pow2.message();
  Status kivi = KVFormat::Kivi(4).Validate(KVRole::kV, 48);
  ASSERT_FALSE(kivi.ok());
  EXPECT_NE(kivi.message().find("multiple of 32"), std::string::npos) << kivi.message();
  EXPECT_TRUE(KVFormat::Kivi(2).Validate(KVRole::kK, 96).ok());
}

// llama-2-7b: 32 layers × 32 KV heads × head_dim 128, blocks of 16 tokens.
TEST(KVFormatTest, Llama2_7bBytesPerToken) {
  const KVShape shape{32, 32, 128};
  struct Want {
    KVFormat k, v;
    size_t bytes_per_token;
  };
  const Want wants[] = {
      {DType::kF16, DType::kF16, 524288},
      {DType::kQ8_0, DType::kQ8_0, 278528},  // 2 × 4 groups of 34 bytes per head
      {DType::kQ4_0, DType::kQ4_0, 147456},  // 2 × 4 × 18
      {KVFormat::RotatedQ4_0(), DType::kQ4_0, 147456},
      // K: 128 codes of b bits + (f16 scale + f16 min) × 128 channels / 16 tokens;
      // V: 4 groups of (f16 scale + f16 min + 32 codes of b bits).
      {KVFormat::Kivi(4), KVFormat::Kivi(4), 1024 * ((64 + 32) + 4 * 20)},
      {KVFormat::Kivi(2), KVFormat::Kivi(2), 1024 * ((32 + 32) + 4 * 12)},
  };
  for (const Want& w : wants) {
    auto l = KVLayout::Make(shape, 16, w.k, w.v);
    ASSERT_TRUE(l.ok());
    EXPECT_EQ(l->bytes_per_token(), w.bytes_per_token) << w.k.name();
    EXPECT_EQ(l->bytes_per_block(), 16 * w.bytes_per_token) << w.k.name();
    EXPECT_EQ(l->staging_bytes_per_sequence(), w.k.is_kivi() ? 32u * 32 * 16 * 128 * 2 : 0u);
  }
}

TEST(HadamardTest, RotationIsOrthogonalAndUndone) {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int32_t n : {1, 2, 32, 128, 256}) {
    std::vector<float> q(n), k(n);
    for (float& x : q) x = nd(rng);
    for (float& x : k) x = nd(rng);
    std::vector<float> rq = q, rk = k;
    HadamardRotate(rq.data(), n);
    HadamardRotate(rk.data(), n);
    double dot = 0, rdot = 0, norm = 0, rnorm = 0;
    for (int32_t i = 0; i < n; ++i) {
      dot += double{q[i]} * k[i];
      rdot += double{rq[i]} * rk[i];
      norm += double{k[i]} * k[i];
      rnorm += double{rk[i]} * rk[i];
    }
    EXPECT_NEAR(rdot, dot, 1e-5 * n);
    EXPECT_NEAR(rnorm, norm, 1e-5 * norm);
    HadamardUnrotate(rk.data(), n);
    for (int32_t i = 0; i < n; ++i) ASSERT_NEAR(rk[i], k[i], 1e-5f) << n;
  }
}

TEST(HadamardTest, SpreadsAnOutlierOverTheWholeRow) {
  std::vector<float> x(128, 0.0f);
  x[5] = 16.0f;
  HadamardRotate(x.data(), 128);
  for (float v : x) EXPECT_FLOAT_EQ(std::abs(v), 16.0f / std::sqrt(128.0f));
}

// ---- round trips ----

constexpr int32_t kHeads = 2, kHeadDim = 64, kBlock = 16, kTokens = 3 * kBlock;

// x[token][head][d]: N(0, 1), one outlier channel (+12, as K has), and every token of the
// second head offset by −5 so that asymmetric formats have a minimum far from 0.
std::vector<float> TestValues(uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> nd;
  std::vector<float> x(kTokens * kHeads * kHeadDim);
  for (int32_t t = 0; t < kTokens; ++t)
    for (int32_t h = 0; h < kHeads; ++h)
      for (int32_t d = 0; d < kHeadDim; ++d) {
        x[(t * kHeads + h) * kHeadDim + d] =
            nd(rng) + (d == 9 ? 12.0f : 0.0f) + (h == 1 ? -5.0f : 0.0f);
      }
  return x;
}

// The bound for element x of a quantization group whose values lie in [lo, hi] (the group:
// 32 elements of a row for q8_0 / q4_0 / a KIVI V, one channel over the block's tokens for a
// KIVI K, the element itself for f16 / bf16), with amax = max(|lo|, |hi|), L = 2^b − 1:
//   f32     0
//   f16     2^-11 |x|            bf16   2^-8 |x|         (round to nearest)
//   q8_0    amax / 254 + 2^-11 amax                      (half a step, + the f16 scale)
//   q4_0    amax / 8 + 2^-11 amax   (a full step where the far side clamps at +7)
//   k4, k2  (hi − lo + 2^-10 |lo|) / (2L) · (1 + 2^-9)   (half the stored scale; see kivi.h)
//           + for K the f16 staging: 2^-11 |x|
double Bound(KVFormat f, KVRole role, float x, float lo, float hi) {
  const double amax = std::max(std::abs(lo), std::abs(hi));
  if (f.is_kivi()) {
    const double levels = (1 << f.bits()) - 1;
    const double b = (hi - lo + std::ldexp(std::abs(lo), -10)) / (2 * levels) * (1 + 1.0 / 512);
    return b + (role == KVRole::kK ? std::ldexp(std::abs(x), -11) : 0.0) + 1e-7;
  }
  switch (f.row_type()) {
    case DType::kF32: return 0;
    case DType::kF16: return std::ldexp(std::abs(x), -11);
    case DType::kBF16: return std::ldexp(std::abs(x), -8);
    case DType::kQ8_0: return amax / 254 + std::ldexp(amax, -11);
    case DType::kQ4_0: return amax / 8 + std::ldexp(amax, -11);
  }
  return 0;
}

// [lo, hi] of the group holding element (t, h, d).
std::pair<float, float> GroupRange(KVFormat f, KVRole role, const std::vector<float>& x,
                                   int32_t t, int32_t h, int32_t d) {
  auto at = [&](int32_t tt, int32_t dd) { return x[(tt * kHeads + h) * kHeadDim + dd]; };
  float lo = at(t, d), hi = lo;
  if (f.staged(role)) {
    for (int32_t tt = t / kBlock * kBlock; tt < (t / kBlock + 1) * kBlock; ++tt) {
      lo = std::min(lo, at(tt, d));
      hi = std::max(hi, at(tt, d));
    }
  } else if (f.is_kivi() || BlockElems(f.row_type()) > 1) {
    for (int32_t dd = d / 32 * 32; dd < (d / 32 + 1) * 32; ++dd) {
      lo = std::min(lo, at(t, dd));
      hi = std::max(hi, at(t, dd));
    }
  }
  return {lo, hi};
}

// Writes the test values as K and V of every token, sealing full blocks, into a fresh cache.
struct RoundTrip {
  std::vector<float> x;
  KVCache kv;

  RoundTrip(KVFormat k, KVFormat v)
      : x(TestValues(17)),
        kv(KVLayout::Make(KVShape{1, kHeads, kHeadDim}, kBlock, k, v).value(),
           kTokens / kBlock) {
    kv.Append(SeqId(0), kTokens);
    for (int32_t t = 0; t < kTokens; ++t) {
      const float* row = &x[t * kHeads * kHeadDim];
      kv.WriteK(SeqId(0), 0, t, row);
      kv.WriteV(SeqId(0), 0, t, row);
      if ((t + 1) % kBlock == 0) kv.SealK(SeqId(0), 0);
    }
  }
  std::vector<float> Read(KVRole role, int32_t t, int32_t h) const {
    std::vector<float> y(kHeadDim);
    if (role == KVRole::kK) {
      kv.ReadK(SeqId(0), 0, h, t, y.data());
    } else {
      kv.ReadV(SeqId(0), 0, h, t, y.data());
    }
    return y;
  }
};

TEST(RoundTripTest, EveryFormatWithinItsBound) {
  for (KVFormat f : KVFormat::All()) {
    if (f.rotated()) continue;  // checked in the norm below
    SCOPED_TRACE(f.name());
    RoundTrip rt(f, f);
    for (KVRole role : {KVRole::kK, KVRole::kV}) {
      for (int32_t t = 0; t < kTokens; ++t)
        for (int32_t h = 0; h < kHeads; ++h) {
          const std::vector<float> y = rt.Read(role, t, h);
          for (int32_t d = 0; d < kHeadDim; ++d) {
            const float x = rt.x[(t * kHeads + h) * kHeadDim + d];
            const auto [lo, hi] = GroupRange(f, role, rt.x, t, h, d);
            ASSERT_LE(std::abs(y[d] - x), Bound(f, role, x, lo, hi))
                << (role == KVRole::kK ? "K" : "V") << " t=" << t << " h=" << h << " d=" << d;
          }
        }
    }
  }
}

// q4_0r quantizes R k with q4_0 and reads back Rᵀ of that, so its error is the q4_0 error of
// the rotated row carried back unchanged in length: ‖k − k̂‖₂ ≤ ‖q4_0 bound of R k‖₂.
TEST(RoundTripTest, RotatedQ4_0WithinTheQ4_0BoundOfTheRotatedRow) {
  RoundTrip rt(KVFormat::RotatedQ4_0(), DType::kQ4_0);
  for (int32_t t = 0; t < kTokens; ++t)
    for (int32_t h = 0; h < kHeads; ++h) {
      const float* x = &rt.x[(t * kHeads + h) * kHeadDim];
      std::vector<float> rx(x, x + kHeadDim);
      HadamardRotate(rx.data(), kHeadDim);
      double bound2 = 0, err2 = 0;
      for (int32_t g = 0; g < kHeadDim; g += 32) {
        float amax = 0;
        for (int32_t d = g; d < g + 32; ++d) amax = std::max(amax, std::abs(rx[d]));
        bound2 += 32 * std::pow(Bound(DType::kQ4_0, KVRole::kK, 0, -amax, amax), 2);
      }
      const std::vector<float> y = rt.Read(KVRole::kK, t, h);
      for (int32_t d = 0; d < kHeadDim; ++d) err2 += std::pow(y[d] - x[d], 2);
      ASSERT_LE(std::sqrt(err2), std::sqrt(bound2)) << "t=" << t << " h=" << h;
    }
}

// With an outlier channel, q4_0's group scale is set by the outlier and the rest of its
// group collapses to a few levels; rotated, the outlier is spread and the error drops.
TEST(RoundTripTest, RotationLowersTheQ4_0ErrorOfRowsWithAnOutlier) {
  double err[2] = {0, 0};
  int i = 0;
  for (KVFormat k : {KVFormat(DType::kQ4_0), KVFormat::RotatedQ4_0()}) {
    RoundTrip rt(k, DType::kF16);
    for (int32_t t = 0; t < kTokens; ++t) {
      const std::vector<float> y = rt.Read(KVRole::kK, t, 0);
      for (int32_t d = 0; d < kHeadDim; ++d) err[i] += std::pow(y[d] - rt.x[t * kHeads * kHeadDim + d], 2);
    }
    ++i;
  }
  EXPECT_LT(err[1], 0.8 * err[0]) << "q4_0 " << err[0] << " q4_0r " << err[1];
}

TEST(KiviTest, ConstantGroupsAreExact) {
  for (int bits : {4, 2}) {
    std::vector<float> x(64, 3.1f), y(64);
    std::vector<uint8_t> row(kivi::VRowBytes(bits, 64));
    kivi::QuantizeVRow(bits, x.data(), row.data(), 64);
    kivi::DequantizeVRow(bits, row.data(), y.data(), 64);
    // 3.1 is not an f16 value: the stored minimum is rounded down and the scale covers the gap.
    for (float v : y) EXPECT_NEAR(v, 3.1f, 3.1f / 1024);
  }
}

TEST(KiviTest, KTileCodesAndChannelsRoundTrip) {
  const int32_t bs = 4, d = 32;
  std::vector<uint16_t> rows(bs * d);
  for (int32_t j = 0; j < bs; ++j)
    for (int32_t c = 0; c < d; ++c) rows[j * d + c] = F32ToF16(static_cast<float>(5 * j * (c % 3)));
  for (int bits : {4, 2}) {
    std::vector<uint8_t> tile(kivi::KTileBytes(bits, bs, d));
    std::vector<float> scratch(3 * d), y(d);
    kivi::QuantizeKTile(bits, rows.data(), bs, d, tile.data(), scratch.data());
    // Channel c takes the values 5·j·(c mod 3), j < 4: steps of 0, 5 or 10, on exact levels
    // at both widths (scales 5 and 10 at 2 bits, 1 and 2 at 4 bits).
    for (int32_t j = 0; j < bs; ++j) {
      kivi::DequantizeKSlot(bits, tile.data(), j, d, y.data());
      for (int32_t c = 0; c < d; ++c) EXPECT_EQ(y[c], static_cast<float>(5 * j * (c % 3)));
    }
  }
}

}  // namespace
}  // namespace kvllm
