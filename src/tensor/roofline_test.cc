// The roofline's figures are sane (positive, finite, in a plausible range) and its loops
// compute what they claim; no timing assertions.
#include "tensor/roofline.h"

#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <vector>

#include "tensor/thread_pool.h"

namespace kvllm {
namespace {

TEST(RooflineTest, ReadSumsAddEveryWord) {
  std::vector<uint64_t> words(1024);  // a multiple of 16 words
  std::iota(words.begin(), words.end(), uint64_t{1});
  const uint64_t want = 1024 * 1025 / 2;
  EXPECT_EQ(internal::ReadSum_scalar(words.data(), 1024), want);
  if (Kernels().level >= SimdLevel::kAvx2) {
    // std::vector's storage is aligned for new[] (16 bytes); the AVX2 loop needs 32.
    alignas(32) static uint64_t aligned[1024];
    std::copy(words.begin(), words.end(), aligned);
    EXPECT_EQ(internal::ReadSum_avx2(aligned, 1024), want);
  }
}

TEST(RooflineTest, FmaLoopsConvergeToTheFixedPoint) {
  // Each chain tends to 0.001 / (1 - 0.999) = 1; twelve chains sum to 12.
  EXPECT_NEAR(internal::FmaLoop_scalar(100'000), internal::kFmaChains, 0.1);
  if (Kernels().level >= SimdLevel::kAvx2) {
    EXPECT_NEAR(internal::FmaLoop_avx2(100'000), internal::kFmaChains * internal::kFmaLanesAvx2,
                0.5);
  }
  if (Kernels().level == SimdLevel::kAvx512) {
    EXPECT_NEAR(internal::FmaLoop_avx512(100'000),
                internal::kFmaChains * internal::kFmaLanesAvx512, 1.0);
  }
}

// What a dot loop returns, step by step as roofline.h describes it.
int64_t ExpectedDotLoop(int64_t iters, int lanes) {
  int64_t sum = 0;
  for (int k = 0; k < internal::kFmaChains; ++k) {
    for (int l = 0; l < lanes; ++l) {
      auto v = static_cast<uint32_t>(internal::DotLoopStart(k, l));
      for (int64_t i = 0; i < iters; ++i) {
        v += (v & 0xff) + (v >> 8 & 0xff) + (v >> 16 & 0xff) + (v >> 24);
      }
      sum += static_cast<int32_t>(v);
    }
  }
  return sum;
}

TEST(RooflineTest, DotLoopsAddEachLanesBytes) {
  EXPECT_EQ(internal::DotLoop_scalar(1000), ExpectedDotLoop(1000, 1));
  if (Kernels().level >= SimdLevel::kAvx2) {
    EXPECT_EQ(internal::DotLoop_avx2(1000), ExpectedDotLoop(1000, 8));
  }
  if (Kernels().level == SimdLevel::kAvx512) {
    EXPECT_EQ(internal::DotLoop_avx512(1000), ExpectedDotLoop(1000, 16));
  }
}

TEST(RooflineTest, FiguresAreSane) {
  ThreadPool pool(2);
  RooflineOptions options;
  options.buffer_bytes = int64_t{64} << 20;  // past the L3 of the test machines, quick
  options.passes = 2;
  const Roofline r = MeasureRoofline(pool, options);
  EXPECT_EQ(r.threads, 2);
  EXPECT_EQ(r.buffer_bytes, int64_t{64} << 20);
  EXPECT_EQ(r.level, Kernels().level);
  for (double v :
       {r.read_bytes_per_s, r.fma_flops_per_s, r.int8_ops_per_s, r.matmul_flops_per_s}) {
    EXPECT_TRUE(std::isfinite(v));
    EXPECT_GT(v, 0);
  }
  EXPECT_GE(r.read_bytes_per_s, 0.5e9);
  EXPECT_LE(r.read_bytes_per_s, 1000e9);
  EXPECT_GE(r.fma_flops_per_s, 0.1e9);
  EXPECT_LE(r.fma_flops_per_s, 100e12);
  EXPECT_LE(r.int8_ops_per_s, 1000e12);
  EXPECT_LE(r.matmul_flops_per_s, 100e12);
}

// A probe keeps its buffer: whole 1 MiB chunks (at least one), each pass a sane rate.
TEST(RooflineTest, ReadProbeReadsItsWholeChunksEveryPass) {
  ThreadPool pool(2);
  EXPECT_EQ(ReadProbe(pool, 1).bytes(), int64_t{1} << 20);
  ReadProbe probe(pool, (int64_t{64} << 20) + 5);
  EXPECT_EQ(probe.bytes(), int64_t{64} << 20);
  for (int i = 0; i < 3; ++i) {
    const double bw = probe.Pass();
    EXPECT_GE(bw, 0.5e9);
    EXPECT_LE(bw, 1000e9);
  }
}

TEST(RooflineTest, DefaultBufferIsAtLeastAGibibyte) {
  EXPECT_GE(DefaultRooflineBufferBytes(), int64_t{1} << 30);
  EXPECT_EQ(DefaultRooflineBufferBytes() % (int64_t{1} << 20), 0);
}

}  // namespace
}  // namespace kvllm
