#include "tensor/roofline.h"

#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <memory>
#include <new>
#include <random>
#include <vector>

#include "base/huge_pages.h"
#include "tensor/thread_pool.h"

namespace kvllm {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kChunkBytes = kMiB;  // one ParallelFor task of the streaming read
constexpr int64_t kChunkWords = kChunkBytes / static_cast<int64_t>(sizeof(uint64_t));

using internal::ThreadSum;

bool UseAvx2() { return Kernels().level >= SimdLevel::kAvx2; }

double Seconds(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Best (largest) work / time over `passes` timed runs of `pass` after one untimed run.
template <typename Pass>
double BestRate(double work_per_pass, int32_t passes, Pass pass) {
  pass();
  double best = 0;
  for (int32_t i = 0; i < std::max(passes, 1); ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    pass();
    const double s = Seconds(t0);
    if (s > 0) best = std::max(best, work_per_pass / s);
  }
  return best;
}

}  // namespace

namespace internal {

uint64_t ReadSum_scalar(const uint64_t* p, int64_t n) {
  uint64_t s0 = 0, s1 = 0, s2 = 0, s3 = 0;
  for (int64_t i = 0; i < n; i += 4) {
    s0 += p[i];
    s1 += p[i + 1];
    s2 += p[i + 2];
    s3 += p[i + 3];
  }
  return s0 + s1 + s2 + s3;
}

float FmaLoop_scalar(int64_t iters) {
  float c[kFmaChains];
  for (int k = 0; k < kFmaChains; ++k) c[k] = 0.1f * static_cast<float>(k);
  for (int64_t i = 0; i < iters; ++i) {
    for (int k = 0; k < kFmaChains; ++k) c[k] = c[k] * 0.999f + 0.001f;
  }
  float s = 0;
  for (float v : c) s += v;
  return s;
}

int64_t DotLoop_scalar(int64_t iters) {
  uint32_t c[kFmaChains];
  for (int k = 0; k < kFmaChains; ++k) c[k] = static_cast<uint32_t>(DotLoopStart(k, 0));
  for (int64_t i = 0; i < iters; ++i) {
    for (uint32_t& v : c) v += (v & 0xff) + (v >> 8 & 0xff) + (v >> 16 & 0xff) + (v >> 24);
  }
  int64_t s = 0;
  for (uint32_t v : c) s += static_cast<int32_t>(v);
  return s;
}

}  // namespace internal

int64_t DefaultRooflineBufferBytes() {
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);  // 0 or -1 when unknown
  const int64_t eight_l3 = l3 > 0 ? 8 * static_cast<int64_t>(l3) : 0;
  const int64_t bytes = std::max<int64_t>(1024 * kMiB, eight_l3);
  return (bytes + kChunkBytes - 1) / kChunkBytes * kChunkBytes;
}

ReadProbe::ReadProbe(ThreadPool& pool, int64_t buffer_bytes)
    : pool_(pool),
      n_chunks_(std::max<int64_t>(1, buffer_bytes / kChunkBytes)),
      sums_(static_cast<size_t>(pool.size())) {
  // [n_chunks][kChunkWords] words in transparent huge pages, as the engine's streamed data
  // (weights read with --no-mmap, the KV pool): 4 KiB pages cost a TLB miss and a restart of
  // the hardware prefetcher every 4 KiB, and made this figure swing between 40 and 63 GB/s
  // from run to run on a machine whose decode did not move.
  buffer_ = HugePageBuffer::Allocate(static_cast<size_t>(bytes()));
  if (buffer_.data() == nullptr) throw std::bad_alloc();
  auto* words = reinterpret_cast<uint64_t*>(buffer_.data());
  // Touch every page (so the timed passes read memory, not fault pages in).
  pool_.ParallelFor(n_chunks_, [words](int64_t chunk, int) {
    uint64_t* p = words + chunk * kChunkWords;
    for (int64_t i = 0; i < kChunkWords; ++i) p[i] = static_cast<uint64_t>(chunk + i);
  });
}

double ReadProbe::Pass() {
  auto read_sum = UseAvx2() ? internal::ReadSum_avx2 : internal::ReadSum_scalar;
  const auto* words = reinterpret_cast<const uint64_t*>(buffer_.data());
  const auto t0 = std::chrono::steady_clock::now();
  pool_.ParallelFor(n_chunks_, [&](int64_t chunk, int thread) {
    sums_[thread].words += read_sum(words + chunk * kChunkWords, kChunkWords);
  });
  const double s = Seconds(t0);
  for (const ThreadSum& t : sums_) sink_ = sink_ + t.words;  // used: the loads cannot be dropped
  return s > 0 ? static_cast<double>(bytes()) / s : 0;
}

double MeasureReadBandwidth(ThreadPool& pool, int64_t buffer_bytes, int32_t passes) {
  ReadProbe probe(pool, buffer_bytes);
  return BestRate(static_cast<double>(probe.bytes()), passes, [&] { probe.Pass(); });
}

double MeasureFmaPeak(ThreadPool& pool, int32_t passes) {
  const SimdLevel level = Kernels().level;
  const int64_t iters = level >= SimdLevel::kAvx2 ? 250'000 : 100'000;  // a millisecond a task
  int lanes = 1;
  auto loop = internal::FmaLoop_scalar;
  if (level == SimdLevel::kAvx512) {
    lanes = internal::kFmaLanesAvx512;
    loop = internal::FmaLoop_avx512;
  } else if (level == SimdLevel::kAvx2) {
    lanes = internal::kFmaLanesAvx2;
    loop = internal::FmaLoop_avx2;
  }
  const int64_t n_tasks = 16 * static_cast<int64_t>(pool.size());
  std::vector<ThreadSum> sums(pool.size());
  const double flops = 2.0 * lanes * internal::kFmaChains * static_cast<double>(iters) * n_tasks;
  const double peak = BestRate(flops, passes, [&] {
    pool.ParallelFor(n_tasks, [&](int64_t, int thread) { sums[thread].floats += loop(iters); });
  });
  volatile float sink = 0;
  for (const ThreadSum& s : sums) sink = sink + s.floats;
  return peak;
}

double MeasureInt8DotPeak(ThreadPool& pool, int32_t passes) {
  const SimdLevel level = Kernels().level;
  const int64_t iters = level >= SimdLevel::kAvx2 ? 250'000 : 100'000;
  int lanes = 1;
  auto loop = internal::DotLoop_scalar;
  if (level == SimdLevel::kAvx512) {
    lanes = 16;
    loop = internal::DotLoop_avx512;
  } else if (level == SimdLevel::kAvx2) {
    lanes = 8;
    loop = internal::DotLoop_avx2;
  }
  const int64_t n_tasks = 16 * static_cast<int64_t>(pool.size());
  std::vector<ThreadSum> sums(pool.size());
  const double ops = 8.0 * lanes * internal::kFmaChains * static_cast<double>(iters) * n_tasks;
  const double peak = BestRate(ops, passes, [&] {
    pool.ParallelFor(n_tasks, [&](int64_t, int thread) {
      sums[thread].words += static_cast<uint64_t>(loop(iters));
    });
  });
  volatile uint64_t sink = 0;
  for (const ThreadSum& s : sums) sink = sink + s.words;
  return peak;
}

double MeasureMatMulF32(ThreadPool& pool, int32_t passes) {
  // W 512 KiB and X 64 KiB: each thread's rows of W stay in its L2 from call to call.
  constexpr int64_t kOut = 512, kIn = 256, kTok = 64, kCalls = 20;
  std::vector<float> w(kOut * kIn), x(kTok * kIn), y(kTok * kOut);  // [kOut][kIn], [kTok][kIn]
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  for (float& v : w) v = dist(rng);
  for (float& v : x) v = dist(rng);
  const double flops = 2.0 * kOut * kIn * kTok * kCalls;
  return BestRate(flops, passes, [&] {
    for (int64_t i = 0; i < kCalls; ++i) {
      MatMul(DType::kF32, w.data(), kOut, kIn, x.data(), kTok, y.data(), &pool);
    }
  });
}

Roofline MeasureRoofline(ThreadPool& pool, const RooflineOptions& options) {
  Roofline r;
  r.level = Kernels().level;
  r.threads = pool.size();
  const int64_t bytes =
      options.buffer_bytes > 0 ? options.buffer_bytes : DefaultRooflineBufferBytes();
  r.buffer_bytes = std::max<int64_t>(1, bytes / kChunkBytes) * kChunkBytes;  // what is read
  r.read_bytes_per_s = MeasureReadBandwidth(pool, r.buffer_bytes, options.passes);
  r.fma_flops_per_s = MeasureFmaPeak(pool, options.passes);
  r.int8_ops_per_s = MeasureInt8DotPeak(pool, options.passes);
  r.matmul_flops_per_s = MeasureMatMulF32(pool, options.passes);
  return r;
}

}  // namespace kvllm
