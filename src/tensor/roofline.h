// The machine's two ceilings for the roofline of `kvllm bench`:
//   - streaming read bandwidth: every thread of a pool sums its share of a buffer far larger
//     than the last-level cache (decode reads every weight once per token, so it is bound by
//     this);
//   - FMA peak: every thread runs a register-only loop of independent fused multiply-add
//     chains, enough of them to hide the FMA latency (prefill with float weights is bound by
//     this: it is the hard ceiling no f32 matmul can pass);
//   - 8-bit dot peak: the same with the 8-bit integer dot of the Q8_0 / Q4_0 kernels (AVX-512
//     vpdpbusd: 64 multiply-adds an instruction, four times an FMA's 16), the ceiling of
//     their matmuls;
// and, for comparison, kvllm's own f32 MatMul on a problem that stays in the L2 cache (what
// the prefill micro-kernel reaches when memory is not in the way).
//
// Each figure is the best of several timed passes after a warm-up: the best pass is the one
// least disturbed by other processes, which is what a ceiling should be. The code is chosen
// at run time like the kernels (AVX-512 or AVX2 FMAs when Kernels() is at that level, a scalar
// loop otherwise), so the ceilings belong to the same instruction set the kernels use. Timing only; no state is kept.
#pragma once

#include <cstdint>
#include <vector>

#include "base/huge_pages.h"
#include "tensor/kernels.h"

namespace kvllm {

class ThreadPool;

struct RooflineOptions {
  // Size of the streamed buffer; 0 = max(1 GiB, 8 x the L3 cache).
  int64_t buffer_bytes = 0;
  int32_t passes = 5;  // timed passes per figure (the best one is reported)
};

struct Roofline {
  SimdLevel level = SimdLevel::kScalar;  // instruction set of the loops
  int32_t threads = 0;
  int64_t buffer_bytes = 0;       // the streamed buffer
  double read_bytes_per_s = 0;    // streaming read bandwidth, all threads
  double fma_flops_per_s = 0;     // register-only FMA peak, all threads (2 FLOPs per FMA lane)
  double int8_ops_per_s = 0;      // register-only 8-bit dot peak, all threads (2 per multiply-add)
  double matmul_flops_per_s = 0;  // MatMul, f32 weights, L2-resident, all threads
};

// Measures all four figures with every thread of `pool` (about a second and `buffer_bytes`
// of memory, freed on return).
Roofline MeasureRoofline(ThreadPool& pool, const RooflineOptions& options = {});

namespace internal {
// A thread's sums of the loops, one per thread on its own cache line (kept, so that no load or
// FMA can be dropped).
struct alignas(64) ThreadSum {
  uint64_t words = 0;
  float floats = 0;
};
}  // namespace internal

// The read loop of the bandwidth figure over a buffer allocated and touched once, for figures
// taken one pass at a time beside other work (kvllm bench reads before every decode step:
// a shared machine's bandwidth changes between fast and slow spells of a fraction of a
// second, and a step is judged by the spell it ran in).
class ReadProbe {
 public:
  ReadProbe(ThreadPool& pool, int64_t buffer_bytes);  // a whole number of 1 MiB chunks, >= 1
  ReadProbe(const ReadProbe&) = delete;
  ReadProbe& operator=(const ReadProbe&) = delete;

  // Bytes per second of one pass over the buffer with every thread of the pool.
  double Pass();
  int64_t bytes() const { return n_chunks_ << 20; }

 private:
  ThreadPool& pool_;
  int64_t n_chunks_;
  HugePageBuffer buffer_;
  std::vector<internal::ThreadSum> sums_;
  volatile uint64_t sink_ = 0;
};

// The parts, exposed for tests.
int64_t DefaultRooflineBufferBytes();
double MeasureReadBandwidth(ThreadPool& pool, int64_t buffer_bytes, int32_t passes);
double MeasureFmaPeak(ThreadPool& pool, int32_t passes);
double MeasureInt8DotPeak(ThreadPool& pool, int32_t passes);
double MeasureMatMulF32(ThreadPool& pool, int32_t passes);

namespace internal {

// Sum of the n 64-bit words at p (n a multiple of 16, p 32-byte aligned): a streaming read
// the compiler cannot drop.
uint64_t ReadSum_scalar(const uint64_t* p, int64_t n);
uint64_t ReadSum_avx2(const uint64_t* p, int64_t n);  // AVX2 CPUs only

// Runs `iters` iterations of kFmaChains independent multiply-add chains of one vector each
// (16 floats for AVX-512, 8 for AVX2, 1 for scalar) and returns a value depending on all of
// them. FLOPs done: iters * kFmaChains * lanes * 2.
constexpr int kFmaChains = 12;  // > latency x FMA units per cycle on current x86 cores
constexpr int kFmaLanesAvx2 = 8;
constexpr int kFmaLanesAvx512 = 16;
float FmaLoop_scalar(int64_t iters);
float FmaLoop_avx2(int64_t iters);    // AVX2 CPUs only
float FmaLoop_avx512(int64_t iters);  // AVX-512 CPUs only

// Runs `iters` steps of kFmaChains independent chains of the 8-bit dot the integer kernels
// use (AVX-512 vpdpbusd; AVX2 vpmaddubsw, vpmaddwd, vpaddd; plain integer code), each on a
// vector of 32-bit lanes (16, 8, 1). A step adds to every lane its own four bytes times 1:
// lane += bytesum(lane), a chain through the multiplier the compiler cannot hoist. Lane l of
// chain k starts at DotLoopStart(k, l); returns the sum of all lanes at the end. Ops done:
// iters * kFmaChains * lanes * 8 (four multiply-adds a lane).
constexpr int32_t DotLoopStart(int chain, int lane) { return 16 * chain + lane + 1; }
int64_t DotLoop_scalar(int64_t iters);
int64_t DotLoop_avx2(int64_t iters);    // AVX2 CPUs only
int64_t DotLoop_avx512(int64_t iters);  // AVX-512 CPUs with VNNI only

}  // namespace internal
}  // namespace kvllm
