// Every SIMD kernel set against the scalar reference, and MatMul against MatMul_ref.
#include "tensor/kernels.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/kernels_internal.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

namespace kvllm {
namespace {

constexpr DType kAllTypes[] = {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0};

// Float types at sizes around the 8- and 16-lane vectors and the 32- and 64-element unrolls;
// block types at whole blocks, odd and even counts.
std::vector<int64_t> TestSizes(DType t) {
  if (BlockElems(t) == 1) return {1, 7, 8, 9, 15, 17, 31, 33, 63, 65, 100, 1000, 4099};
  return {32, 64, 96, 160, 4128};
}

std::vector<float> RandomFloats(int64_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

// A row of type t built from random floats, and its exact dequantized values.
struct Row {
  std::vector<uint8_t> bytes;
  std::vector<float> values;
};

Row RandomRow(DType t, int64_t n, uint32_t seed) {
  Row row;
  row.bytes.resize(RowBytes(t, n));
  row.values.resize(n);
  const std::vector<float> x = RandomFloats(n, seed);
  QuantizeRow(t, x.data(), row.bytes.data(), n);
  DequantizeRow(t, row.bytes.data(), row.values.data(), n);
  return row;
}

// Float sums of n terms drift by O(sqrt(n)) ulps of the sum of magnitudes in practice (O(n)
// at worst); 1e-5 * sqrt(n) allows ~80 * sqrt(n) ulps, far above reordering noise yet far
// below any indexing or scaling bug.
double DotTolerance(const std::vector<float>& w, const float* x, int64_t n) {
  double sum_abs = 0.0;
  for (int64_t i = 0; i < n; ++i) sum_abs += std::fabs(static_cast<double>(w[i]) * x[i]);
  return 1e-5 * std::sqrt(static_cast<double>(n)) * sum_abs;
}

std::string Describe(const KernelSet* ks, DType t, int64_t n) {
  return std::string(SimdLevelName(ks->level)) + " " + DTypeName(t) + " n=" + std::to_string(n);
}

TEST(KernelsTest, AvailableSetsStartWithReference) {
  const std::vector<const KernelSet*> sets = AvailableKernelSets();
  ASSERT_FALSE(sets.empty());
  EXPECT_EQ(sets[0], &ReferenceKernels());
  EXPECT_EQ(sets[0]->level, SimdLevel::kScalar);
  bool active_listed = false;
  for (const KernelSet* ks : sets) active_listed |= ks == &Kernels();
  EXPECT_TRUE(active_listed);
}

TEST(KernelsTest, SimdEnvCanOnlyLowerTheLevel) {
  using internal::ChooseSimdLevel;
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx2, nullptr), SimdLevel::kAvx2);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx2, ""), SimdLevel::kAvx2);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx2, "scalar"), SimdLevel::kScalar);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx2, "avx2"), SimdLevel::kAvx2);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx2, "avx512"), SimdLevel::kAvx2);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kScalar, "avx2"), SimdLevel::kScalar);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx2, "bogus"), SimdLevel::kAvx2);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx512, nullptr), SimdLevel::kAvx512);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx512, "avx2"), SimdLevel::kAvx2);
  EXPECT_EQ(ChooseSimdLevel(SimdLevel::kAvx512, "avx512"), SimdLevel::kAvx512);
}

TEST(KernelsTest, ReferenceDotMatchesDoubleSum) {
  for (DType t : kAllTypes) {
    for (int64_t n : TestSizes(t)) {
      const Row row = RandomRow(t, n, 1);
      const std::vector<float> x = RandomFloats(n, 2);
      double exact = 0.0;
      for (int64_t i = 0; i < n; ++i) exact += static_cast<double>(row.values[i]) * x[i];
      EXPECT_NEAR(ReferenceKernels().dot(t, row.bytes.data(), x.data(), n), exact,
                  DotTolerance(row.values, x.data(), n))
          << DTypeName(t) << " n=" << n;
    }
  }
}

TEST(KernelsTest, DotMatchesReference) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (DType t : kAllTypes) {
      for (int64_t n : TestSizes(t)) {
        const Row row = RandomRow(t, n, 3);
        const std::vector<float> x = RandomFloats(n, 4);
        EXPECT_NEAR(ks->dot(t, row.bytes.data(), x.data(), n),
                    ref.dot(t, row.bytes.data(), x.data(), n),
                    DotTolerance(row.values, x.data(), n))
            << Describe(ks, t, n);
      }
    }
  }
}

// Rows that start anywhere: the SIMD dots align their loads on the row, so every start
// offset takes a different split between the first masked step, the loop and the tail.
TEST(KernelsTest, DotOfFloatRowsAtEveryStartOffset) {
  const KernelSet& ref = ReferenceKernels();
  constexpr int64_t kMaxOffset = 16;
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
      for (int64_t n : {5, 100, 301}) {
        const Row row = RandomRow(t, n + kMaxOffset, 5);
        const std::vector<float> x = RandomFloats(n + kMaxOffset, 6);
        for (int64_t off = 0; off < kMaxOffset; ++off) {
          const uint8_t* start = row.bytes.data() + RowBytes(t, off);
          const std::vector<float> values(row.values.begin() + off, row.values.end());
          EXPECT_NEAR(ks->dot(t, start, x.data() + off, n), ref.dot(t, start, x.data() + off, n),
                      DotTolerance(values, x.data() + off, n))
              << Describe(ks, t, n) << " offset=" << off;
        }
      }
    }
  }
}

TEST(KernelsTest, DotF32MatchesReference) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t n : TestSizes(DType::kF32)) {
      const std::vector<float> a = RandomFloats(n, 5);
      const std::vector<float> b = RandomFloats(n, 6);
      EXPECT_NEAR(ks->dot_f32(a.data(), b.data(), n), ref.dot_f32(a.data(), b.data(), n),
                  DotTolerance(a, b.data(), n))
          << Describe(ks, DType::kF32, n);
    }
    EXPECT_EQ(ks->dot_f32(nullptr, nullptr, 0), 0.0f);
  }
}

TEST(KernelsTest, AxpyMatchesReference) {
  constexpr float kA = -0.37f;
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (DType t : kAllTypes) {
      for (int64_t n : TestSizes(t)) {
        const Row row = RandomRow(t, n, 7);
        const std::vector<float> y0 = RandomFloats(n, 8);
        // One guard element past the end catches tail stores that overrun.
        std::vector<float> y = y0;
        std::vector<float> want = y0;
        y.push_back(42.0f);
        ks->axpy(t, row.bytes.data(), kA, y.data(), n);
        ref.axpy(t, row.bytes.data(), kA, want.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          // A fused multiply-add and a different grouping of a * d * q differ by a few ulps.
          const double tol = 4 * 0x1p-24 * (std::fabs(y0[i]) + std::fabs(kA * row.values[i]));
          ASSERT_NEAR(y[i], want[i], tol) << Describe(ks, t, n) << " i=" << i;
        }
        EXPECT_EQ(y[n], 42.0f) << Describe(ks, t, n);
      }
    }
  }
}

TEST(KernelsTest, DequantizeMatchesReferenceExactly) {
  // Every conversion involved (f16, bf16, int8 and 4-bit to f32, one multiply by d) is exact or
  // a single rounding of the same product, so the results must agree bit for bit.
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (DType t : kAllTypes) {
      for (int64_t n : TestSizes(t)) {
        const Row row = RandomRow(t, n, 9);
        std::vector<float> y(n + 1, 42.0f);
        std::vector<float> want(n);
        ks->dequantize(t, row.bytes.data(), y.data(), n);
        ref.dequantize(t, row.bytes.data(), want.data(), n);
        for (int64_t i = 0; i < n; ++i) {
          ASSERT_EQ(y[i], want[i]) << Describe(ks, t, n) << " i=" << i;
        }
        EXPECT_EQ(y[n], 42.0f) << Describe(ks, t, n);
      }
    }
  }
}

// Lines for a kernel to ask for as it goes (Prefetch): it may ask for some or all of them, a
// line at a time, and must leave `next` no further than the line holding the last byte. Its
// L2 requests `far` beyond the lines reach past the buffer, which a prefetch may: it reads
// nothing.
struct AheadBuffer {
  std::vector<uint8_t> bytes = std::vector<uint8_t>(1000);
  Prefetch range{bytes.data(), bytes.data() + bytes.size(), 4096};
  void ExpectAdvancedWithin() const {
    EXPECT_GE(range.next, bytes.data());
    EXPECT_LT(range.next, bytes.data() + bytes.size() + 64);
    EXPECT_EQ((range.next - bytes.data()) % 64, 0);
  }
};

// V rows of every type weighted_rows reads (F32, and F16, BF16 and Q8_0 read in place from a
// cache), at widths around the 8 and 16 lanes and the 32- and 64-column strips.
TEST(KernelsTest, WeightedRowsMatchesReference) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (DType vt : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0}) {
      for (int64_t d : {1, 7, 8, 17, 32, 33, 48, 64, 80, 96, 100, 130}) {
        if (d % BlockElems(vt) != 0) continue;
        for (int64_t n : {0, 1, 5, 16}) {
          for (int64_t n_g : {1, 3, 4, 5, 8, 9}) {
            const int64_t p_stride = n + 3;  // rows of p longer than n: only n are read
            const std::vector<float> p = RandomFloats(n_g * p_stride, 31);
            const int64_t n_v = std::max<int64_t>(BlockElems(vt), n * d);
            const std::vector<float> vf = RandomFloats(n_v, 32);
            std::vector<uint8_t> v(RowBytes(vt, vf.size()));
            QuantizeRow(vt, vf.data(), v.data(), static_cast<int64_t>(vf.size()));
            std::vector<float> y = RandomFloats(n_g * d + 1, 33);
            std::vector<float> want(y.begin(), y.end() - 1);
            y.back() = 42.0f;
            AheadBuffer ahead;
            ks->weighted_rows(p.data(), p_stride, n_g, vt, v.data(), n, d, y.data(), &ahead.range);
            ref.weighted_rows(p.data(), p_stride, n_g, vt, v.data(), n, d, want.data(), nullptr);
            ahead.ExpectAdvancedWithin();
            for (int64_t i = 0; i < n_g * d; ++i) {
              // A Q8_0 V is summed in integers, to the same bits at every level (kernels.h).
              ASSERT_NEAR(y[i], want[i], vt == DType::kQ8_0 ? 0.0 : 1e-5 * (1 + n))
                  << SimdLevelName(ks->level) << " " << DTypeName(vt) << " d=" << d
                  << " n=" << n << " n_g=" << n_g;
            }
            EXPECT_EQ(y.back(), 42.0f) << "wrote past y";
          }
        }
      }
    }
  }
}

// The integer sum of a Q8_0 V against the sum of p_j * d_j * code_j in double: within the
// rounding kernels.h states, sum_j |code_j| * D / 65534 per run (D the run's largest block
// scale), plus the f32 ends. Runs longer than kQ8VRunRows restart the rounding; probabilities
// of very different sizes (as softmax gives), a head of zeros (y unchanged) and the extremes
// of |p| <= 1 included.
TEST(KernelsTest, Q8VWeightsRoundWithinTheStatedBound) {
  constexpr int64_t d = 64, n_g = 3;
  std::mt19937 rng(5);
  std::exponential_distribution<float> ex(0.5f);
  for (int64_t n : {1, 2, 7, 128, 300}) {
    const std::vector<float> vf = RandomFloats(n * d, 40);
    std::vector<uint8_t> v(RowBytes(DType::kQ8_0, n * d));
    QuantizeRow(DType::kQ8_0, vf.data(), v.data(), n * d);
    std::vector<float> p(n_g * n);
    for (int64_t j = 0; j < n; ++j) {
      p[j] = std::exp(-ex(rng));
      p[n + j] = 0.0f;
      p[2 * n + j] = j % 2 ? -1.0f : 1.0f;
    }
    const std::vector<float> y0 = RandomFloats(n_g * d, 41);
    for (const KernelSet* ks : AvailableKernelSets()) {
      std::vector<float> y = y0;
      ks->weighted_rows(p.data(), n, n_g, DType::kQ8_0, v.data(), n, d, y.data(), nullptr);
      const auto* blocks = reinterpret_cast<const BlockQ8_0*>(v.data());
      for (int64_t g = 0; g < n_g; ++g) {
        for (int64_t i = 0; i < d; ++i) {
          double exact = y0[g * d + i], bound = 1e-6 * std::fabs(y0[g * d + i]);
          for (int64_t r0 = 0; r0 < n; r0 += kQ8VRunRows) {
            const int64_t end = std::min(n, r0 + kQ8VRunRows);
            double dmax = 0, codes = 0;
            for (int64_t j = r0; j < end; ++j) {
              const BlockQ8_0& b = blocks[j * (d / kQK) + i / kQK];
              exact += double(p[g * n + j]) * F16ToF32(b.d) * b.qs[i % kQK];
              dmax = std::max(dmax, double(std::fabs(F16ToF32(b.d))));
              codes += std::abs(b.qs[i % kQK]);
            }
            bound += codes * dmax / 65534 + 1e-6 * codes * dmax;
          }
          ASSERT_NEAR(y[g * d + i], exact, bound)
              << SimdLevelName(ks->level) << " n=" << n << " g=" << g << " i=" << i;
          if (g == 1) {
            ASSERT_EQ(y[g * d + i], y0[g * d + i]) << "zero weights changed y";
          }
        }
      }
    }
  }
}

TEST(KernelsTest, MaxF32FindsTheMaxWhereverItIs) {
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t n : {1, 2, 7, 8, 9, 15, 16, 17, 33, 64, 100}) {
      for (int64_t at = 0; at < n; ++at) {
        std::vector<float> x = RandomFloats(n + 1, 44);  // all in [-1, 1)
        x[n] = 100.0f;                                      // past the end: not read
        x[at] = 2.0f + static_cast<float>(at);
        ASSERT_EQ(ks->max_f32(x.data(), n), x[at])
            << SimdLevelName(ks->level) << " n=" << n << " at=" << at;
      }
      const std::vector<float> neg(n, -3.0f);
      EXPECT_EQ(ks->max_f32(neg.data(), n), -3.0f) << SimdLevelName(ks->level);
    }
  }
}

// The reference against a plain double sum: it is the oracle the SIMD versions are held to.
// The slots start inside the first tile of 4 and run on through the next two.
TEST(KernelsTest, ScoresF16TReferenceIsTheDotOfEachSlot) {
  constexpr int64_t kD = 5, kLd = 4, kFirst = 3, kN = 7, kG = 2, kTiles = 3;
  const std::vector<float> q = RandomFloats(kG * kD, 40);
  const std::vector<float> kf = RandomFloats(kTiles * kD * kLd, 41);
  std::vector<uint16_t> k(kf.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = F32ToF16(kf[i]);
  std::vector<float> s(kG * kN);
  ReferenceKernels().scores_f16t(k.data(), kLd, kFirst, kN, q.data(), kG, kD, 0.5f, s.data(),
                                 kN, nullptr);
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t j = 0; j < kN; ++j) {
      const int64_t tile = (kFirst + j) / kLd, lane = (kFirst + j) % kLd;
      double want = 0;
      for (int64_t i = 0; i < kD; ++i) {
        want += double{q[g * kD + i]} * F16ToF32(k[(tile * kD + i) * kLd + lane]);
      }
      EXPECT_NEAR(s[g * kN + j], 0.5 * want, 1e-6);
    }
  }
}

// Every level on awkward sizes: tiles of 16 slots and of others, runs that start inside a tile
// and cross into the next ones, slots around the 8 and 16 lanes, head counts that leave every
// remainder of 8, 4 and 2, rows of s longer than n (only n are written), and heads of more
// than the 128 dimensions the AVX2 level holds transposed at a time.
TEST(KernelsTest, ScoresF16TMatchesReference) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t d : {1, 3, 32, 64, 100, 150}) {
      for (int64_t ld : {5, 16, 21, 40}) {
        for (int64_t first : {int64_t{0}, int64_t{3}, ld - 1}) {
          for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 40, 70}) {
            for (int64_t n_g : {1, 2, 3, 4, 5, 7, 8, 9, 15}) {
              const int64_t tiles = (first + n + ld - 1) / ld + 1, s_stride = n + 2;
              const std::vector<float> q = RandomFloats(n_g * d, 42);
              const std::vector<float> kf = RandomFloats(tiles * d * ld, 43);
              std::vector<uint16_t> k(kf.size());
              for (size_t i = 0; i < k.size(); ++i) k[i] = F32ToF16(kf[i]);
              std::vector<float> got(n_g * s_stride, 42.0f), want(n_g * s_stride, 42.0f);
              AheadBuffer ahead;
              ks->scores_f16t(k.data(), ld, first, n, q.data(), n_g, d, 0.125f, got.data(),
                              s_stride, &ahead.range);
              ref.scores_f16t(k.data(), ld, first, n, q.data(), n_g, d, 0.125f, want.data(),
                              s_stride, nullptr);
              ahead.ExpectAdvancedWithin();
              for (int64_t i = 0; i < n_g * s_stride; ++i) {
                ASSERT_NEAR(got[i], want[i], 1e-6 * (1 + d))
                    << SimdLevelName(ks->level) << " d=" << d << " ld=" << ld
                    << " first=" << first << " n=" << n << " n_g=" << n_g << " i=" << i;
              }
            }
          }
        }
      }
    }
  }
}

// Q8_0 rows of random values, stored dimension-major (Q8DimsLayout) with ld slots.
std::vector<uint8_t> Q8Dims(int64_t d, int64_t ld, uint32_t seed) {
  const Q8DimsLayout lay{ld};
  std::vector<uint8_t> out(static_cast<size_t>(d / kQK * lay.GroupBytes()));
  std::vector<BlockQ8_0> row(d / kQK);
  for (int64_t j = 0; j < ld; ++j) {
    const std::vector<float> x = RandomFloats(d, seed + static_cast<uint32_t>(j));
    QuantizeRow(DType::kQ8_0, x.data(), row.data(), d);
    for (int64_t b = 0; b < d / kQK; ++b) {
      std::memcpy(&out[lay.ScaleOffset(b, j)], &row[b].d, 2);
      for (int64_t i = 0; i < kQK; ++i) {
        out[lay.CodeOffset(b, i, j)] = static_cast<uint8_t>(row[b].qs[i]);
      }
    }
  }
  return out;
}

// The reference equals the dot of q with each slot's dequantized Q8_0 row.
// The query quantized once, as attention does, for every head of the group.
std::vector<BlockQ8Act> QuantizedQuery(const std::vector<float>& q, int64_t d) {
  std::vector<BlockQ8Act> out(q.size() / kQK);
  for (size_t g = 0; g < q.size() / d; ++g) {
    ReferenceKernels().quantize_act(&q[g * d], &out[g * d / kQK], d);
  }
  return out;
}

TEST(KernelsTest, ScoresQ8TReferenceIsTheDotOfEachDequantizedSlot) {
  constexpr int64_t kD = 64, kLd = 5, kFirst = 1, kN = 3, kG = 2;
  const std::vector<BlockQ8Act> q = QuantizedQuery(RandomFloats(kG * kD, 45), kD);
  const std::vector<uint8_t> k = Q8Dims(kD, kLd, 46);
  const Q8DimsLayout lay{kLd};
  std::vector<float> s(kG * kN);
  ReferenceKernels().scores_q8t(k.data(), kLd, kFirst, kN, q.data(), kG, kD, 0.5f, s.data(), kN,
                                nullptr);
  for (int64_t g = 0; g < kG; ++g) {
    for (int64_t j = 0; j < kN; ++j) {
      double want = 0;
      for (int64_t b = 0; b < kD / kQK; ++b) {
        uint16_t dh;
        std::memcpy(&dh, &k[lay.ScaleOffset(b, kFirst + j)], 2);
        const BlockQ8Act& qb = q[g * kD / kQK + b];
        for (int64_t i = 0; i < kQK; ++i) {
          const auto code = static_cast<int8_t>(k[lay.CodeOffset(b, i, kFirst + j)]);
          want += double{qb.d} * qb.qs[i] * F16ToF32(dh) * code;
        }
      }
      EXPECT_NEAR(s[g * kN + j], 0.5 * want, 1e-5 * (1 + std::abs(want)));
    }
  }
}

// Every level on awkward sizes: strips of 16 slots (ld 16, the 64-byte load of four rows),
// runs that start inside the rows and end short of 8 or 16, and head counts that leave every
// remainder of 8, 4 and 2. Codes of -128, -127 and 127 with queries at their extremes check
// that the q + 128 trick of the VNNI level and AVX2's maddubs(|k|, sign(q, k)) lose nothing.
TEST(KernelsTest, ScoresQ8TMatchesReference) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t d : {32, 64, 96}) {
      for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 31, 40}) {
        for (int64_t n_g : {1, 2, 3, 5, 7, 8, 9, 15}) {
          for (int64_t first : {int64_t{0}, int64_t{3}}) {
            const int64_t ld = n == 16 && first == 0 ? 16 : first + n + 2, s_stride = n + 2;
            std::vector<float> qf = RandomFloats(n_g * d, 47);
            qf[0] = 1.0f;  // a group whose largest value is at each sign's extreme
            qf[1] = -1.0f;
            const std::vector<BlockQ8Act> q = QuantizedQuery(qf, d);
            std::vector<uint8_t> k = Q8Dims(d, ld, 48);
            const Q8DimsLayout lay{ld};
            for (int64_t j = 0; j < ld; ++j) {
              k[lay.CodeOffset(0, 0, j)] = static_cast<uint8_t>(j % 2 ? 127 : -127);
              if (j % 2 == 0) k[lay.CodeOffset(0, 1, j)] = static_cast<uint8_t>(-128);
            }
            std::vector<float> got(n_g * s_stride, 42.0f), want(n_g * s_stride, 42.0f);
            AheadBuffer ahead;
            ks->scores_q8t(k.data(), ld, first, n, q.data(), n_g, d, 0.125f, got.data(),
                           s_stride, &ahead.range);
            ref.scores_q8t(k.data(), ld, first, n, q.data(), n_g, d, 0.125f, want.data(),
                           s_stride, nullptr);
            ahead.ExpectAdvancedWithin();
            for (int64_t i = 0; i < n_g * s_stride; ++i) {
              ASSERT_NEAR(got[i], want[i], 1e-5 * (1 + std::abs(want[i])))
                  << SimdLevelName(ks->level) << " d=" << d << " n=" << n << " n_g=" << n_g
                  << " first=" << first << " i=" << i;
            }
          }
        }
      }
    }
  }
}

// SwiGLU over gate values from -90 (where exp(-g) would overflow a float) to 30.
TEST(KernelsTest, SwiGluMatchesStdExp) {
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 200}) {
      std::vector<float> gate(n + 1, 42.0f), up(n);
      for (int64_t j = 0; j < n; ++j) {
        gate[j] = -90.0f + 120.0f * j / std::max<int64_t>(1, n - 1);
        up[j] = 0.5f + 0.01f * j;
      }
      const std::vector<float> in(gate.begin(), gate.end() - 1);
      ks->swiglu(gate.data(), up.data(), n);
      for (int64_t j = 0; j < n; ++j) {
        const double g = in[j];
        const double want = g / (1.0 + std::exp(-g)) * up[j];
        // Where exp(-g) overflows, 0 stands for a value below 1e-35.
        ASSERT_NEAR(gate[j], want, 1e-6 * std::fabs(want) + 1e-35)
            << SimdLevelName(ks->level) << " n=" << n << " g=" << g;
      }
      EXPECT_EQ(gate[n], 42.0f) << "wrote past gate";
    }
  }
}

// f32 to f16 at every level against the scalar F32ToF16, bit for bit: random values across
// the half range, ties to even, subnormals, overflow to inf, infinities and NaNs.
TEST(KernelsTest, ToF16MatchesScalarConversionBitForBit) {
  std::mt19937 rng(5);
  std::uniform_int_distribution<uint32_t> bits;
  const std::vector<float> special = {0.0f, -0.0f, 65504.0f, 65519.99f, 65520.0f, -70000.0f,
                                      0x1p-24f, 0x1p-25f, 0x1.8p-25f, 0x1p-14f, 0x1.ff8p-15f,
                                      1.0f + 0x1p-11f, 1.0f + 0x3p-11f, INFINITY, -INFINITY,
                                      std::bit_cast<float>(0x7fc00001u),
                                      std::bit_cast<float>(0xff812345u)};
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 64, 200}) {
      std::vector<float> x(n);
      for (int64_t j = 0; j < n; ++j) {
        // Exponents around the half range (2^-30 .. 2^17) with random mantissas and signs.
        const uint32_t r = bits(rng);
        const uint32_t exp = 97 + r % 48;
        x[j] = j < static_cast<int64_t>(special.size()) && j % 2 == 1
                   ? special[j]
                   : std::bit_cast<float>((r & 0x807fffffu) | (exp << 23));
      }
      std::vector<uint16_t> got(n + 1, 0x1234), want(n);
      ks->to_f16(x.data(), got.data(), n);
      for (int64_t j = 0; j < n; ++j) want[j] = F32ToF16(x[j]);
      for (int64_t j = 0; j < n; ++j) {
        ASSERT_EQ(got[j], want[j]) << SimdLevelName(ks->level) << " n=" << n << " x=" << x[j];
      }
      EXPECT_EQ(got[n], 0x1234) << "wrote past y";
    }
    std::vector<uint16_t> got(special.size());
    ks->to_f16(special.data(), got.data(), static_cast<int64_t>(special.size()));
    for (size_t j = 0; j < special.size(); ++j) {
      EXPECT_EQ(got[j], F32ToF16(special[j])) << SimdLevelName(ks->level) << " x=" << special[j];
    }
  }
}

// Softmax numerators: scores minus their max, from 0 down to where exp underflows.
TEST(KernelsTest, ExpSumMatchesStdExp) {
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t n : {0, 1, 7, 8, 9, 15, 16, 17, 33, 200}) {
      std::vector<float> x(n + 1, 42.0f);
      for (int64_t j = 0; j < n; ++j) x[j] = -100.0f * j / std::max<int64_t>(1, n - 1) + 3.0f;
      const std::vector<float> in(x.begin(), x.end() - 1);
      const float sum = ks->exp_sum(x.data(), n, 3.0f);
      double want_sum = 0;
      for (int64_t j = 0; j < n; ++j) {
        const double want = std::exp(static_cast<double>(in[j]) - 3.0);
        want_sum += want;
        // A few ulps, or the smallest normal float where exp underflows.
        ASSERT_NEAR(x[j], want, 4e-7 * want + 1.2e-38)
            << SimdLevelName(ks->level) << " n=" << n << " j=" << j;
      }
      EXPECT_NEAR(sum, want_sum, 1e-6 * want_sum + 1e-37) << SimdLevelName(ks->level) << " n=" << n;
      EXPECT_EQ(x[n], 42.0f) << "wrote past x";
    }
  }
}

constexpr DType kQ8ActTypes[] = {DType::kQ8_0, DType::kQ4_0};

// Random activations with the cases quantization must get right: a block of zeros (d = 0),
// a block whose largest element is negative, and elements that land on a .5 tie.
std::vector<float> AwkwardActivations(int64_t n, uint32_t seed) {
  std::vector<float> x = RandomFloats(n, seed);
  std::fill(x.begin(), x.begin() + kQK, 0.0f);
  if (n >= 2 * kQK) {
    x[kQK] = -127.0f;  // amax negative; d = 1 exactly, so the next two are exact ties
    x[kQK + 1] = 2.5f;
    x[kQK + 2] = 3.5f;
  }
  return x;
}

TEST(KernelsTest, QuantizeActIsBitIdenticalAcrossLevels) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (int64_t n : TestSizes(DType::kQ8_0)) {
      const std::vector<float> x = AwkwardActivations(n, 21);
      std::vector<BlockQ8Act> got(n / kQK + 1);
      std::vector<BlockQ8Act> want(n / kQK);
      got.back().d = 42.0f;
      ks->quantize_act(x.data(), got.data(), n);
      ref.quantize_act(x.data(), want.data(), n);
      for (int64_t b = 0; b < n / kQK; ++b) {
        ASSERT_EQ(got[b].d, want[b].d) << Describe(ks, DType::kQ8_0, n) << " block " << b;
        for (int j = 0; j < kQK; ++j) {
          ASSERT_EQ(got[b].qs[j], want[b].qs[j]) << Describe(ks, DType::kQ8_0, n) << " j=" << j;
        }
      }
      EXPECT_EQ(got.back().d, 42.0f) << "wrote past the last block";
    }
  }
}

TEST(KernelsTest, QuantizeActRoundsToNearestWithinHalfAStep) {
  const std::vector<float> x = AwkwardActivations(96, 22);
  std::vector<BlockQ8Act> xq(3);
  ReferenceKernels().quantize_act(x.data(), xq.data(), 96);
  EXPECT_EQ(xq[0].d, 0.0f);
  for (int j = 0; j < kQK; ++j) EXPECT_EQ(xq[0].qs[j], 0);
  EXPECT_EQ(xq[1].qs[0], -127);
  EXPECT_EQ(xq[1].d, 1.0f);
  EXPECT_EQ(xq[1].qs[1], 2);  // ties to even
  EXPECT_EQ(xq[1].qs[2], 4);
  for (int64_t i = 0; i < 96; ++i) {
    const BlockQ8Act& b = xq[i / kQK];
    EXPECT_LE(std::fabs(b.d * b.qs[i % kQK] - x[i]), 0.5f * b.d * (1 + 1e-5f)) << "i=" << i;
  }
}

// dot_act against the exact sum of the dequantized weights times the dequantized activations:
// the integer dot of each block is exact, so only the f32 sum over blocks rounds.
TEST(KernelsTest, DotActMatchesExactSumAndReference) {
  const KernelSet& ref = ReferenceKernels();
  for (const KernelSet* ks : AvailableKernelSets()) {
    for (DType t : kQ8ActTypes) {
      for (int64_t n : TestSizes(t)) {
        const Row row = RandomRow(t, n, 23);
        const std::vector<float> x = AwkwardActivations(n, 24);
        std::vector<BlockQ8Act> xq(n / kQK);
        ref.quantize_act(x.data(), xq.data(), n);
        std::vector<float> xd(n);
        double exact = 0.0;
        for (int64_t i = 0; i < n; ++i) {
          xd[i] = xq[i / kQK].d * xq[i / kQK].qs[i % kQK];
          exact += static_cast<double>(row.values[i]) * xd[i];
        }
        const double tol = DotTolerance(row.values, xd.data(), n);
        EXPECT_NEAR(ks->dot_act(t, row.bytes.data(), xq.data(), n), exact, tol)
            << Describe(ks, t, n);
        EXPECT_NEAR(ks->dot_act(t, row.bytes.data(), xq.data(), n),
                    ref.dot_act(t, row.bytes.data(), xq.data(), n), tol)
            << Describe(ks, t, n);
      }
    }
  }
}

// Weights of -128 (possible in a Q8_0 file, never written by QuantizeRow) and activations at
// +-127 are the extremes of the AVX2 sign trick.
TEST(KernelsTest, DotActAtIntegerExtremes) {
  std::vector<BlockQ8_0> w(2);
  std::vector<BlockQ8Act> xq(2);
  int64_t want = 0;
  for (int b = 0; b < 2; ++b) {
    w[b].d = 0x3c00;  // 1.0 in f16
    xq[b].d = 1.0f;
    for (int j = 0; j < kQK; ++j) {
      w[b].qs[j] = static_cast<int8_t>(j % 2 == 0 ? -128 : 127);
      xq[b].qs[j] = static_cast<int8_t>(j % 3 == 0 ? -127 : 127);
      want += int64_t{w[b].qs[j]} * xq[b].qs[j];
    }
  }
  for (const KernelSet* ks : AvailableKernelSets()) {
    EXPECT_EQ(ks->dot_act(DType::kQ8_0, w.data(), xq.data(), 2 * kQK), static_cast<float>(want))
        << SimdLevelName(ks->level);
  }
}

// A token's outputs must not depend on the batch it is computed in: the engine batches
// sequences together, and a greedy token must be the same as when the sequence runs alone.
TEST(MatMulTest, QuantizedWeightsGiveEachTokenTheSameBitsInAnyBatch) {
  ThreadPool pool(2);
  constexpr int64_t kOut = 67, kTok = 9;
  // An odd number of blocks; then rows at and past what the AVX-512 decode prepares at once
  // (256 pairs of blocks: 16,416 columns hold 256 pairs and one block more, 16,480 257 pairs).
  for (int64_t n_in : {2080, 16416, 16480}) {
    for (DType t : kQ8ActTypes) {
      std::vector<uint8_t> w(RowBytes(t, n_in) * kOut);
      const std::vector<float> w_src = RandomFloats(n_in * kOut, 25);
      for (int64_t o = 0; o < kOut; ++o) {
        QuantizeRow(t, w_src.data() + o * n_in, w.data() + o * RowBytes(t, n_in), n_in);
      }
      const std::vector<float> x = RandomFloats(kTok * n_in, 26);
      for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
        std::vector<float> batch(kTok * kOut);
        internal::MatMulWith(*level, t, w.data(), kOut, n_in, x.data(), kTok, batch.data(), &pool);
        for (int64_t tok = 0; tok < kTok; ++tok) {
          std::vector<float> alone(kOut);
          internal::MatMulWith(*level, t, w.data(), kOut, n_in, x.data() + tok * n_in, 1,
                               alone.data(), &pool);
          for (int64_t o = 0; o < kOut; ++o) {
            ASSERT_EQ(alone[o], batch[tok * kOut + o])
                << SimdLevelName(level->set.level) << " " << DTypeName(t) << " token " << tok
                << " n_in " << n_in;
          }
        }
      }
    }
  }
}

// Compares MatMul on `pool`, with every available level's kernels, with MatMul_ref for one
// shape.
void ExpectMatMulMatches(DType t, int64_t n_out, int64_t n_in, int64_t n_tok, ThreadPool* pool) {
  std::vector<uint8_t> w(RowBytes(t, n_in) * n_out);
  std::vector<float> w_values(n_in * n_out);  // [n_out][n_in]
  const std::vector<float> w_src = RandomFloats(n_in * n_out, 10);
  for (int64_t o = 0; o < n_out; ++o) {
    QuantizeRow(t, w_src.data() + o * n_in, w.data() + o * RowBytes(t, n_in), n_in);
    DequantizeRow(t, w.data() + o * RowBytes(t, n_in), w_values.data() + o * n_in, n_in);
  }
  const std::vector<float> x = RandomFloats(n_tok * n_in, 11);  // [n_tok][n_in]
  std::vector<float> want(n_tok * n_out);                        // [n_tok][n_out]
  MatMul_ref(t, w.data(), n_out, n_in, x.data(), n_tok, want.data());
  for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
    std::vector<float> y(n_tok * n_out, std::nanf(""));
    internal::MatMulWith(*level, t, w.data(), n_out, n_in, x.data(), n_tok, y.data(), pool);
    for (int64_t tok = 0; tok < n_tok; ++tok) {
      for (int64_t o = 0; o < n_out; ++o) {
        const std::vector<float> w_row(w_values.begin() + o * n_in,
                                       w_values.begin() + (o + 1) * n_in);
        ASSERT_NEAR(y[tok * n_out + o], want[tok * n_out + o],
                    DotTolerance(w_row, x.data() + tok * n_in, n_in))
            << SimdLevelName(level->set.level) << " " << DTypeName(t) << " n_out=" << n_out
            << " n_in=" << n_in << " n_tok=" << n_tok
            << " threads=" << (pool ? pool->size() : 0) << " y[" << tok << "][" << o << "]";
      }
    }
  }
}

TEST(MatMulTest, MatchesReference) {
  ThreadPool pool1(1);
  ThreadPool pool2(2);
  ThreadPool pool3(3);
  for (ThreadPool* pool : {&pool1, &pool2, &pool3}) {
    for (DType t : kAllTypes) {
      for (int64_t n_out : {1, 17, 67}) {
        for (int64_t n_in : {32, 96, 288}) {
          for (int64_t n_tok : {1, 3, 17}) ExpectMatMulMatches(t, n_out, n_in, n_tok, pool);
        }
      }
    }
  }
}

// Several matrices against one X give what one MatMul each gives, bit for bit: the shared
// quantized X and the joined task list change nothing. Mixed types (q, k and v may differ).
TEST(MatMulTest, SharedProductsEqualSeparateOnes) {
  ThreadPool pool(2);
  constexpr int64_t kIn = 96;
  const std::vector<DType> types = {DType::kQ4_0, DType::kF16, DType::kQ8_0, DType::kF32};
  const std::vector<int64_t> n_outs = {67, 1, 33, 8};
  std::vector<std::vector<uint8_t>> w(types.size());
  for (size_t m = 0; m < types.size(); ++m) {
    const std::vector<float> src = RandomFloats(kIn * n_outs[m], 40 + static_cast<int>(m));
    w[m].resize(RowBytes(types[m], kIn) * n_outs[m]);
    for (int64_t o = 0; o < n_outs[m]; ++o) {
      QuantizeRow(types[m], src.data() + o * kIn, w[m].data() + o * RowBytes(types[m], kIn),
                  kIn);
    }
  }
  for (int64_t n_tok : {1, 5}) {
    const std::vector<float> x = RandomFloats(n_tok * kIn, 50);
    for (ThreadPool* p : {&pool, static_cast<ThreadPool*>(nullptr)}) {
      std::vector<std::vector<float>> shared(types.size());
      std::vector<MatMulOut> outs;
      for (size_t m = 0; m < types.size(); ++m) {
        shared[m].assign(n_tok * n_outs[m], std::nanf(""));
        outs.push_back({types[m], w[m].data(), n_outs[m], shared[m].data()});
      }
      MatMulShared(outs, kIn, x.data(), n_tok, p);
      for (size_t m = 0; m < types.size(); ++m) {
        std::vector<float> alone(n_tok * n_outs[m]);
        MatMul(types[m], w[m].data(), n_outs[m], kIn, x.data(), n_tok, alone.data(), p);
        EXPECT_EQ(shared[m], alone) << DTypeName(types[m]) << " n_tok " << n_tok;
      }
    }
  }
}

// A random [n_out][n_in] matrix of type t in rows, its values, and its rows interleaved 16 at
// a time.
struct PackedMatrix {
  std::vector<uint8_t> rows;
  std::vector<float> values;
  std::vector<uint8_t> packed;
};
PackedMatrix RandomPackedMatrix(DType t, int64_t n_out, int64_t n_in, uint32_t seed) {
  const size_t row_bytes = RowBytes(t, n_in);
  PackedMatrix m{std::vector<uint8_t>(row_bytes * n_out), std::vector<float>(n_in * n_out),
                 std::vector<uint8_t>(row_bytes * n_out)};
  const std::vector<float> src = RandomFloats(n_in * n_out, seed);
  for (int64_t o = 0; o < n_out; ++o) {
    QuantizeRow(t, src.data() + o * n_in, m.rows.data() + o * row_bytes, n_in);
    DequantizeRow(t, m.rows.data() + o * row_bytes, m.values.data() + o * n_in, n_in);
  }
  InterleaveRows(t, m.rows.data(), n_out, n_in, m.packed.data());
  return m;
}

// Matrices stored 16 rows at a time: every level gives the reference's bits (one rounding
// order for all), token by token whatever the batch, and the reference is the row layout's
// product up to rounding. Block counts odd (a last block outside the pairs) and even, several
// tasks, every prefill token tile (8, 4, 2, 1).
TEST(MatMulTest, InterleavedWeightsMatchTheReferenceBitForBit) {
  ThreadPool pool1(1);
  ThreadPool pool2(2);
  for (DType t : kQ8ActTypes) {
    for (int64_t n_out : {16, 80}) {
      for (int64_t n_in : {32, 64, 96, 2080}) {
        const auto [rows, w_values, packed] = RandomPackedMatrix(t, n_out, n_in, 60);
        for (int64_t n_tok : {1, 15}) {
          const std::vector<float> x = RandomFloats(n_tok * n_in, 61);
          std::vector<float> want(n_tok * n_out), by_rows(n_tok * n_out);
          MatMul_ref(t, packed.data(), n_out, n_in, x.data(), n_tok, want.data(),
                     WeightLayout::kInterleaved16);
          MatMul_ref(t, rows.data(), n_out, n_in, x.data(), n_tok, by_rows.data());
          for (int64_t i = 0; i < n_tok * n_out; ++i) {
            const int64_t o = i % n_out;
            const std::vector<float> w_row(w_values.begin() + o * n_in,
                                           w_values.begin() + (o + 1) * n_in);
            const float* x_row = x.data() + i / n_out * n_in;
            ASSERT_NEAR(want[i], by_rows[i], DotTolerance(w_row, x_row, n_in))
                << DTypeName(t) << " n_in " << n_in << " y[" << i / n_out << "][" << o << "]";
          }
          for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
            for (ThreadPool* pool : {&pool1, &pool2}) {
              std::vector<float> y(n_tok * n_out, std::nanf(""));
              internal::MatMulWith(*level, t, packed.data(), n_out, n_in, x.data(), n_tok,
                                   y.data(), pool, WeightLayout::kInterleaved16);
              ASSERT_EQ(y, want) << SimdLevelName(level->set.level) << " " << DTypeName(t)
                                 << " n_out " << n_out << " n_in " << n_in << " n_tok " << n_tok;
            }
          }
        }
      }
    }
  }
}

// F16 and BF16 matrices stored 16 rows at a time: the reference reads them back in the rows'
// order (the rows' bits); at every level prefill (n_tok > 1, dequantized slices across the
// 1,024-column cache blocks at n_in 2080) gives the rows layout's bits and decode (n_tok 1,
// the level's 16-row kernel) their product to within a dot's rounding. Several tasks and
// groups (n_out 80), chunk counts odd and even, strided by 17 (65 chunks), 2 (3 chunks) and
// 19 (34 chunks, a multiple of 17).
TEST(MatMulTest, InterleavedFloatWeightsMatchTheirRows) {
  ThreadPool pool1(1);
  ThreadPool pool2(2);
  for (DType t : {DType::kF16, DType::kBF16}) {
    for (int64_t n_out : {16, 80}) {
      for (int64_t n_in : {32, 96, 1088, 2080}) {
        const auto [rows, w_values, packed] = RandomPackedMatrix(t, n_out, n_in, 62);
        if (n_in > 32) {  // one chunk a row is the rows' order
          ASSERT_NE(packed, rows);
        }
        for (int64_t n_tok : {1, 15}) {
          const std::vector<float> x = RandomFloats(n_tok * n_in, 63);
          std::vector<float> want(n_tok * n_out), ref_packed(n_tok * n_out);
          MatMul_ref(t, rows.data(), n_out, n_in, x.data(), n_tok, want.data());
          MatMul_ref(t, packed.data(), n_out, n_in, x.data(), n_tok, ref_packed.data(),
                     WeightLayout::kInterleaved16);
          ASSERT_EQ(ref_packed, want) << DTypeName(t) << " n_in " << n_in;
          for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
            for (ThreadPool* pool : {&pool1, &pool2}) {
              const std::string what = std::string(SimdLevelName(level->set.level)) + " " +
                                        DTypeName(t) + " n_out " + std::to_string(n_out) +
                                        " n_in " + std::to_string(n_in) + " n_tok " +
                                        std::to_string(n_tok);
              std::vector<float> y(n_tok * n_out, std::nanf("")), by_rows(y);
              internal::MatMulWith(*level, t, packed.data(), n_out, n_in, x.data(), n_tok,
                                   y.data(), pool, WeightLayout::kInterleaved16);
              if (n_tok > 1) {
                internal::MatMulWith(*level, t, rows.data(), n_out, n_in, x.data(), n_tok,
                                     by_rows.data(), pool);
                ASSERT_EQ(y, by_rows) << what;
                continue;
              }
              for (int64_t o = 0; o < n_out; ++o) {
                const std::vector<float> w_row(w_values.begin() + o * n_in,
                                               w_values.begin() + (o + 1) * n_in);
                ASSERT_NEAR(y[o], want[o], DotTolerance(w_row, x.data(), n_in))
                    << what << " y[" << o << "]";
              }
            }
          }
        }
      }
    }
  }
}

// The integer dot of an interleaved block is exact at the extremes of both operands (Q8_0
// codes of -128 and 127, which the offset of 128 maps to 0 and 255, against ±127), in decode
// (one token) and prefill (5 tokens: the AVX2 level's 4-token and 1-token kernels).
TEST(MatMulTest, InterleavedQ8_0IsExactAtTheExtremes) {
  constexpr int64_t kOut = 16, kIn = 2 * kQK;
  std::vector<BlockQ8_0> rows(kOut * 2);
  for (int64_t o = 0; o < kOut; ++o) {
    for (int b = 0; b < 2; ++b) {
      rows[o * 2 + b].d = 0x3c00;  // 1.0
      for (int j = 0; j < kQK; ++j) {
        rows[o * 2 + b].qs[j] = static_cast<int8_t>((j + o) % 2 == 0 ? -128 : 127);
      }
    }
  }
  std::vector<uint8_t> packed(rows.size() * sizeof(BlockQ8_0));
  InterleaveRows(DType::kQ8_0, rows.data(), kOut, kIn, packed.data());
  for (int64_t n_tok : {1, 5}) {
    std::vector<float> x(n_tok * kIn);
    for (int64_t j = 0; j < n_tok * kIn; ++j) x[j] = j % 3 == 0 ? -1.0f : 1.0f;  // ±127
    std::vector<float> y(n_tok * kOut);
    for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
      internal::MatMulWith(*level, DType::kQ8_0, packed.data(), kOut, kIn, x.data(), n_tok,
                           y.data(), nullptr, WeightLayout::kInterleaved16);
      for (int64_t i = 0; i < n_tok * kOut; ++i) {
        const int64_t t = i / kOut, o = i % kOut;
        int64_t want = 0;
        for (int j = 0; j < kIn; ++j) {
          want += int64_t{rows[o * 2 + j / kQK].qs[j % kQK]} * (x[t * kIn + j] < 0 ? -127 : 127);
        }
        // x quantizes with d = 1 / 127: each block's f32(dot) * 1 * d, summed in two steps.
        const float d = 1.0f / 127.0f;
        EXPECT_NEAR(y[i], static_cast<float>(want) * d,
                    1e-6f * std::abs(static_cast<float>(want)))
            << SimdLevelName(level->set.level) << " n_tok " << n_tok << " y[" << t << "][" << o
            << "]";
      }
    }
  }
}

// The same for Q4_0 at its extremes (nibbles 0 and 15, codes -8 and 7) against +127 or -127
// throughout: every product of a block has one sign, the AVX2 kernel's int16 sums of a
// block's pairs at their largest (8 quads x 2 x 15 x 127).
TEST(MatMulTest, InterleavedQ4_0IsExactAtTheExtremes) {
  constexpr int64_t kOut = 16, kIn = 2 * kQK;
  std::vector<BlockQ4_0> rows(kOut * 2);
  for (int64_t o = 0; o < kOut; ++o) {
    for (int b = 0; b < 2; ++b) {
      rows[o * 2 + b].d = 0x3c00;  // 1.0
      std::fill(std::begin(rows[o * 2 + b].qs), std::end(rows[o * 2 + b].qs),
                static_cast<uint8_t>(o % 2 == 0 ? 0xff : 0x00));
    }
  }
  std::vector<uint8_t> packed(rows.size() * sizeof(BlockQ4_0));
  InterleaveRows(DType::kQ4_0, rows.data(), kOut, kIn, packed.data());
  std::vector<float> y(kOut);
  for (float sign : {1.0f, -1.0f}) {
    const std::vector<float> x(kIn, sign);  // quantizes to ±127 with d = 1 / 127
    for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
      internal::MatMulWith(*level, DType::kQ4_0, packed.data(), kOut, kIn, x.data(), 1,
                           y.data(), nullptr, WeightLayout::kInterleaved16);
      for (int64_t o = 0; o < kOut; ++o) {
        const int64_t code = o % 2 == 0 ? 7 : -8;
        const float block = static_cast<float>(code * 127 * kQK * static_cast<int>(sign)) *
                            (1.0f / 127.0f);
        EXPECT_EQ(y[o], block + block) << SimdLevelName(level->set.level) << " row " << o;
      }
    }
  }
}

TEST(MatMulTest, WithoutPool) {
  for (DType t : kAllTypes) {
    ExpectMatMulMatches(t, 67, 96, 1, nullptr);
    ExpectMatMulMatches(t, 67, 96, 5, nullptr);
  }
}

// 57 = one 64-byte line of f16 (32), one 16-wide vector and a tail of 9 in the decode tiles.
TEST(MatMulTest, FloatWeightsAtWidthsOffTheVector) {
  ThreadPool pool(2);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    for (int64_t n_in : {1, 7, 9, 33, 57}) {
      for (int64_t n_tok : {1, 2, 5}) ExpectMatMulMatches(t, 21, n_in, n_tok, &pool);
    }
  }
}

TEST(MatMulTest, LargerThanOneTask) {
  ThreadPool pool(2);
  for (DType t : {DType::kF32, DType::kQ8_0, DType::kQ4_0}) {
    ExpectMatMulMatches(t, 300, 1024, 1, &pool);
    ExpectMatMulMatches(t, 300, 1024, 9, &pool);
  }
}

TEST(MatMulTest, CrossesCacheBlocks) {
  // MatMul splits prefill into slices of input columns and blocks of tokens (1024 and 64 at
  // the time of writing); these shapes leave partial slices and partial token blocks.
  ThreadPool pool(2);
  for (DType t : kAllTypes) ExpectMatMulMatches(t, 37, 2080, 67, &pool);
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16}) {
    ExpectMatMulMatches(t, 9, 1029, 130, &pool);
  }
}

TEST(MatMulTest, EmptyShapesWriteNothing) {
  ThreadPool pool(2);
  float y = 42.0f;
  MatMul(DType::kF32, nullptr, 0, 32, nullptr, 4, &y, &pool);
  MatMul(DType::kF32, nullptr, 4, 32, nullptr, 0, &y, &pool);
  EXPECT_EQ(y, 42.0f);
}

TEST(MatMulTest, NoInputsGiveZeros) {
  ThreadPool pool(2);
  for (int64_t n_tok : {1, 3}) {
    std::vector<float> y(n_tok * 5, 42.0f);
    MatMul(DType::kQ8_0, nullptr, 5, 0, nullptr, n_tok, y.data(), &pool);
    for (float v : y) EXPECT_EQ(v, 0.0f) << "n_tok=" << n_tok;
  }
}

}  // namespace
}  // namespace kvllm
