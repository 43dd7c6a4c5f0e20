#include "tensor/kernels.h"

#include <cpuid.h>

#include <algorithm>
#include <array>
#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "base/status.h"
#include "tensor/kernels_internal.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

namespace kvllm {

namespace internal {

SimdLevel ChooseSimdLevel(SimdLevel supported, const char* env) {
  if (env == nullptr || *env == '\0') return supported;
  const std::string_view want(env);
  SimdLevel requested;
  if (want == "scalar") {
    requested = SimdLevel::kScalar;
  } else if (want == "avx2") {
    requested = SimdLevel::kAvx2;
  } else if (want == "avx512") {
    requested = SimdLevel::kAvx512;
  } else {
    std::fprintf(stderr, "kvllm: ignoring unknown KVLLM_SIMD=%s (scalar|avx2|avx512)\n", env);
    return supported;
  }
  // The variable can only lower the choice: asking for more than the CPU has is not an error.
  return std::min(requested, supported);
}

}  // namespace internal

namespace {

// F16C is read from CPUID leaf 1 (ECX bit 29): clang 14's __builtin_cpu_supports does not
// know "f16c". The builtin's "avx2" also checks that the OS saves the YMM registers.
bool CpuHasAvx2() {
  __builtin_cpu_init();
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) != 0 && (ecx & bit_F16C) != 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
}

// AVX-512 F, BW, VL, DQ and VNNI from CPUID leaf 7, and the OS saving the opmask and all 32
// ZMM registers (XCR0 bits 5-7, besides SSE and AVX state) on a context switch.
bool CpuHasAvx512() {
  if (!CpuHasAvx2()) return false;
  unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
  if (__get_cpuid(1, &eax, &ebx, &ecx, &edx) == 0 || (ecx & bit_OSXSAVE) == 0) return false;
  unsigned xcr0_lo = 0, xcr0_hi = 0;
  __asm__("xgetbv" : "=a"(xcr0_lo), "=d"(xcr0_hi) : "c"(0));
  constexpr unsigned kZmmState = 0xe6;  // SSE, AVX, opmask, ZMM0-15 upper halves, ZMM16-31
  if ((xcr0_lo & kZmmState) != kZmmState) return false;
  if (__get_cpuid_count(7, 0, &eax, &ebx, &ecx, &edx) == 0) return false;
  const unsigned ebx_needed = bit_AVX512F | bit_AVX512DQ | bit_AVX512BW | bit_AVX512VL;
  return (ebx & ebx_needed) == ebx_needed && (ecx & bit_AVX512VNNI) != 0;
}

SimdLevel SupportedLevel() {
  if (CpuHasAvx512()) return SimdLevel::kAvx512;
  return CpuHasAvx2() ? SimdLevel::kAvx2 : SimdLevel::kScalar;
}

const internal::LevelKernels& LevelKernelsFor(SimdLevel level) {
  switch (level) {
    case SimdLevel::kAvx512:
      return internal::Avx512LevelKernels();
    case SimdLevel::kAvx2:
      return internal::Avx2LevelKernels();
    case SimdLevel::kScalar:
      break;
  }
  return internal::ScalarLevelKernels();
}

// Whether InterleaveRows can store a matrix [n_out][n_in] of type t, and MatMul read it so.
bool Interleavable(DType t, int64_t n_out, int64_t n_in) {
  const bool type = UsesQ8Activations(t) || t == DType::kF16 || t == DType::kBF16;
  return type && n_out % 16 == 0 && n_in % kQK == 0;
}

const internal::LevelKernels& ActiveLevelKernels() {
  static const internal::LevelKernels& active = LevelKernelsFor(
      internal::ChooseSimdLevel(SupportedLevel(), std::getenv("KVLLM_SIMD")));
  return active;
}

// Output rows per ParallelFor task. Each task writes whole, disjoint row ranges of Y (for every
// token), 16 or more floats at a time, so threads meet on at most the cache lines at the ends
// of their ranges. Prefill tasks are n_tok times heavier, hence smaller.
constexpr int64_t kMatVecTaskRows = 32;
constexpr int64_t kMatMatTaskRows = 16;
static_assert(kMatMatTaskRows % internal::kTileRows == 0);
// Interleaved weights come in groups of 16 rows, which a task never splits.
static_assert(kMatVecTaskRows % 16 == 0 && kMatMatTaskRows % 16 == 0);

// Prefill cache blocking. A task works on a slice of kSliceCols input columns of its rows
// (dequantized once: 16 x 1024 f32 = 64 KiB, the 4-row tile in use 16 KiB, in L1) against each
// block of kTokBlock tokens in turn (64 x 4 KiB = 256 KiB of X, in L2), so each x vector fetched
// from L2 feeds 4 rows and each w vector in L1 feeds 2 tokens, whatever n_in and n_tok are.
// Partial sums of successive slices are added into Y. A slice boundary must not split a quant
// block.
constexpr int64_t kSliceCols = 1024;
constexpr int64_t kTokBlock = 64;
static_assert(kSliceCols % kQK == 0);

struct MatMulJob {
  const internal::LevelKernels* kernels;
  DType wt;
  const uint8_t* w;  // [n_out] rows of row_bytes
  size_t row_bytes;
  int64_t n_out;
  int64_t n_in;
  const float* x;  // [n_tok][n_in]
  const BlockQ8Act* xq;  // [n_tok][n_in / kQK] X quantized, for Q8_0 and Q4_0 weights
  const int32_t* xsum;   // [n_tok][n_in / kQK] the sums of xq's codes, for interleaved weights
  WeightLayout layout;
  int64_t n_tok;
  float* y;  // [n_tok][n_out]
  int64_t rows_per_task;
};

// This thread's buffers for X quantized, [n_tok][n_in / kQK], and its blocks' code sums.
// Grow, never shrink.
BlockQ8Act* ActScratch(int64_t n_blocks) {
  thread_local std::vector<BlockQ8Act> scratch;
  if (static_cast<int64_t>(scratch.size()) < n_blocks) scratch.resize(n_blocks);
  return scratch.data();
}
int32_t* ActSumScratch(int64_t n_blocks) {
  thread_local std::vector<int32_t> scratch;
  if (static_cast<int64_t>(scratch.size()) < n_blocks) scratch.resize(n_blocks);
  return scratch.data();
}

// Interleaved weights: the task's groups of 16 rows in one call.
void Act16Rows(const MatMulJob& job, int64_t begin, int64_t end) {
  job.kernels->dot_act16({
      .wt = job.wt,
      .w = job.w + begin * job.row_bytes,
      .n_groups = (end - begin) / 16,
      .xq = job.xq,
      .xsum = job.xsum,
      .xq_stride = job.n_in / kQK,
      .n_tok = job.n_tok,
      .n = job.n_in,
      .y = job.y + begin,
      .y_stride = job.n_out,
  });
}

// Quantized weights: every output as one dot_act (bit for bit), through tiles of up to 4 rows
// x 2 tokens so that each block loaded serves several outputs. A task's rows (16 x n_in bytes)
// stay in L1/L2 while the tokens stream past them. Decode hands the level all of a task's
// rows at once.
void ActRows(const MatMulJob& job, int64_t begin, int64_t end) {
  const int64_t blocks = job.n_in / kQK;
  // Decode: the task's rows in one call, which prepares the token's side once for them all.
  const int64_t tile = job.n_tok == 1 ? end - begin : internal::kTileRows;
  for (int64_t g = begin; g < end; g += tile) {
    job.kernels->dot_act_tile({
        .wt = job.wt,
        .w = job.w + g * job.row_bytes,
        .row_bytes = job.row_bytes,
        .n_rows = static_cast<int>(std::min<int64_t>(tile, end - g)),
        .xq = job.xq,
        .xq_stride = blocks,
        .n_tok = job.n_tok,
        .n = job.n_in,
        .y = job.y + g,
        .y_stride = job.n_out,
    });
  }
}

// Float weights interleaved, one token: the task's groups of 16 rows in one call.
void MatVec16Rows(const MatMulJob& job, int64_t begin, int64_t end) {
  job.kernels->dot_rows16({
      .wt = job.wt,
      .w = job.w + begin * job.row_bytes,
      .n_groups = (end - begin) / 16,
      .x = job.x,
      .n = job.n_in,
      .y = job.y + begin,
  });
}

void MatVecRows(const MatMulJob& job, int64_t begin, int64_t end) {
  job.kernels->dot_rows({
      .wt = job.wt,
      .w = job.w + begin * job.row_bytes,
      .row_bytes = job.row_bytes,
      .n_rows = end - begin,
      .x = job.x,
      .n = job.n_in,
      .y = job.y + begin,
  });
}

// Floats between the rows of an interleaved slice: widened chunk by chunk, 16 rows 4 KiB
// apart would be 16 lines written into one L1 set at a time.
constexpr int64_t kInterleavedPad = 16;

// This thread's buffer for one task's dequantized weight slice, [kMatMatTaskRows][kSliceCols]
// f32 (row stride kSliceCols + kInterleavedPad for interleaved weights). Allocated on the
// thread's first prefill, never again.
float* SliceScratch() {
  thread_local std::vector<float> scratch(kMatMatTaskRows * (kSliceCols + kInterleavedPad));
  return scratch.data();
}

// Rows [begin, end) (whole groups) of interleaved float weights, columns [k0, k0 + cols), into
// out[r][stride].
void DequantizeInterleaved(const MatMulJob& job, int64_t begin, int64_t end, int64_t k0,
                           int64_t cols, float* out, int64_t stride) {
  const FloatChunkOrder order(job.n_in / kQK);
  for (int64_t g = begin; g < end; g += 16) {
    job.kernels->widen16(job.wt, job.w + g * job.row_bytes, order, k0 / kQK, cols / kQK,
                         out + (g - begin) * stride, stride);
  }
}

void MatMatRows(const MatMulJob& job, int64_t begin, int64_t end) {
  const int64_t n_rows = end - begin;
  float* scratch = SliceScratch();
  for (int64_t k0 = 0; k0 < job.n_in; k0 += kSliceCols) {
    const int64_t cols = std::min(kSliceCols, job.n_in - k0);
    // w_slice: [n_rows][cols] with row stride w_stride, dequantized once for all the tokens.
    const float* w_slice;
    int64_t w_stride;
    const size_t col_offset = RowBytes(job.wt, k0);
    if (job.wt == DType::kF32) {
      // Used in place; dequantizing would only copy.
      w_slice = reinterpret_cast<const float*>(job.w + begin * job.row_bytes + col_offset);
      w_stride = job.n_in;
    } else if (job.layout == WeightLayout::kInterleaved16) {
      w_stride = cols + kInterleavedPad;
      DequantizeInterleaved(job, begin, end, k0, cols, scratch, w_stride);
      w_slice = scratch;
    } else {
      for (int64_t r = 0; r < n_rows; ++r) {
        job.kernels->set.dequantize(job.wt, job.w + (begin + r) * job.row_bytes + col_offset,
                                    scratch + r * cols, cols);
      }
      w_slice = scratch;
      w_stride = cols;
    }
    for (int64_t t0 = 0; t0 < job.n_tok; t0 += kTokBlock) {
      const int64_t n_tok = std::min(kTokBlock, job.n_tok - t0);
      for (int64_t g = 0; g < n_rows; g += internal::kTileRows) {
        job.kernels->dot_tile({
            .w = w_slice + g * w_stride,
            .w_stride = w_stride,
            .n_rows = static_cast<int>(std::min<int64_t>(internal::kTileRows, n_rows - g)),
            .x = job.x + t0 * job.n_in + k0,
            .x_stride = job.n_in,
            .n_tok = n_tok,
            .n = cols,
            .y = job.y + t0 * job.n_out + begin + g,
            .y_stride = job.n_out,
            .accumulate = k0 > 0,
        });
      }
    }
  }
}

void RunMatMulTask(const MatMulJob& job, int64_t task) {
  const int64_t begin = task * job.rows_per_task;
  const int64_t end = std::min(begin + job.rows_per_task, job.n_out);
  if (job.layout == WeightLayout::kInterleaved16 && job.xq != nullptr) {
    Act16Rows(job, begin, end);
  } else if (job.xq != nullptr) {
    ActRows(job, begin, end);
  } else if (job.n_tok == 1 && job.layout == WeightLayout::kInterleaved16) {
    MatVec16Rows(job, begin, end);
  } else if (job.n_tok == 1) {
    MatVecRows(job, begin, end);
  } else {
    MatMatRows(job, begin, end);
  }
}

}  // namespace

const char* SimdLevelName(SimdLevel level) {
  switch (level) {
    case SimdLevel::kScalar:
      return "scalar";
    case SimdLevel::kAvx2:
      return "avx2";
    case SimdLevel::kAvx512:
      return "avx512";
  }
  return "unknown";
}

const KernelSet& Kernels() { return ActiveLevelKernels().set; }

bool PrefersInterleaved(DType t, int64_t n_out, int64_t n_in) {
  if (!Interleavable(t, n_out, n_in)) return false;
  switch (ActiveLevelKernels().set.level) {
    case SimdLevel::kAvx512:
      return true;
    case SimdLevel::kAvx2:
      // Its float ones are the scalar ones (kernels_avx2.cc).
      return t == DType::kQ4_0 || t == DType::kQ8_0;
    case SimdLevel::kScalar:
      return false;
  }
  return false;
}

std::vector<const internal::LevelKernels*> internal::AvailableLevelKernels() {
  std::vector<const LevelKernels*> levels;
  for (int level = 0; level <= static_cast<int>(SupportedLevel()); ++level) {
    levels.push_back(&LevelKernelsFor(static_cast<SimdLevel>(level)));
  }
  return levels;
}

std::vector<const KernelSet*> AvailableKernelSets() {
  std::vector<const KernelSet*> sets;
  for (const internal::LevelKernels* level : internal::AvailableLevelKernels()) {
    sets.push_back(&level->set);
  }
  return sets;
}

const KernelSet& ReferenceKernels() { return internal::ScalarLevelKernels().set; }

void MatMul(DType wt, const void* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_tok,
            float* y, ThreadPool* pool, WeightLayout layout) {
  internal::MatMulWith(ActiveLevelKernels(), wt, w, n_out, n_in, x, n_tok, y, pool, layout);
}

void MatMulShared(std::span<const MatMulOut> outs, int64_t n_in, const float* x, int64_t n_tok,
                  ThreadPool* pool) {
  internal::MatMulSharedWith(ActiveLevelKernels(), outs, n_in, x, n_tok, pool);
}

void internal::MatMulWith(const LevelKernels& kernels, DType wt, const void* w, int64_t n_out,
                          int64_t n_in, const float* x, int64_t n_tok, float* y,
                          ThreadPool* pool, WeightLayout layout) {
  const MatMulOut out{wt, w, n_out, y, layout};
  MatMulSharedWith(kernels, {&out, 1}, n_in, x, n_tok, pool);
}

void internal::MatMulSharedWith(const LevelKernels& kernels, std::span<const MatMulOut> outs,
                                int64_t n_in, const float* x, int64_t n_tok, ThreadPool* pool) {
  KVLLM_CHECK(outs.size() <= kMaxSharedMatMuls);
  if (n_tok <= 0) return;
  BlockQ8Act* xq = nullptr;
  int32_t* xsum = nullptr;
  const auto quantized = [](const MatMulOut& o) { return UsesQ8Activations(o.wt); };
  const auto interleaved = [](const MatMulOut& o) {
    return o.layout == WeightLayout::kInterleaved16;
  };
  for (const MatMulOut& o : outs) {
    KVLLM_CHECK(!interleaved(o) || Interleavable(o.wt, o.n_out, n_in));
  }
  if (n_in > 0 && std::any_of(outs.begin(), outs.end(), quantized)) {
    const int64_t blocks = n_in / kQK;
    xq = ActScratch(n_tok * blocks);
    for (int64_t t = 0; t < n_tok; ++t) {
      kernels.set.quantize_act(x + t * n_in, xq + t * blocks, n_in);
    }
    const auto quantized_interleaved = [&](const MatMulOut& o) {
      return quantized(o) && interleaved(o);
    };
    if (std::any_of(outs.begin(), outs.end(), quantized_interleaved)) {
      xsum = ActSumScratch(n_tok * blocks);
      ActCodeSums(xq, n_tok * blocks, xsum);
    }
  }
  // The jobs' tasks, numbered one after another: job j has tasks [first[j], first[j + 1]).
  std::array<MatMulJob, kMaxSharedMatMuls> jobs;
  std::array<int64_t, kMaxSharedMatMuls + 1> first{};
  size_t n_jobs = 0;
  for (const MatMulOut& o : outs) {
    if (o.n_out <= 0) continue;
    if (n_in == 0) {  // empty sums; the prefill path would never touch Y
      std::fill(o.y, o.y + n_tok * o.n_out, 0.0f);
      continue;
    }
    jobs[n_jobs] = {
        .kernels = &kernels,
        .wt = o.wt,
        .w = static_cast<const uint8_t*>(o.w),
        .row_bytes = RowBytes(o.wt, n_in),
        .n_out = o.n_out,
        .n_in = n_in,
        .x = x,
        .xq = quantized(o) ? xq : nullptr,
        .xsum = xsum,
        .layout = o.layout,
        .n_tok = n_tok,
        .y = o.y,
        .rows_per_task = n_tok == 1 ? kMatVecTaskRows : kMatMatTaskRows,
    };
    const MatMulJob& job = jobs[n_jobs];
    first[n_jobs + 1] = first[n_jobs] + (job.n_out + job.rows_per_task - 1) / job.rows_per_task;
    ++n_jobs;
  }
  const auto run = [&](int64_t task) {
    size_t j = 0;
    while (task >= first[j + 1]) ++j;
    RunMatMulTask(jobs[j], task - first[j]);
  };
  const int64_t n_tasks = first[n_jobs];
  if (pool == nullptr) {
    for (int64_t task = 0; task < n_tasks; ++task) run(task);
    return;
  }
  pool->ParallelFor(n_tasks, [&run](int64_t task, int) { run(task); });
}

void MatMul_ref(DType wt, const void* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_tok,
                float* y, WeightLayout layout) {
  const KernelSet& ref = ReferenceKernels();
  const auto* rows = static_cast<const uint8_t*>(w);
  const size_t row_bytes = RowBytes(wt, n_in);
  std::vector<BlockQ8Act> xq(UsesQ8Activations(wt) ? n_in / kQK : 0);
  std::vector<int32_t> xsum(xq.size());
  KVLLM_CHECK(layout == WeightLayout::kRows || Interleavable(wt, n_out, n_in));
  for (int64_t t = 0; t < n_tok; ++t) {
    if (!xq.empty()) ref.quantize_act(x + t * n_in, xq.data(), n_in);
    if (layout == WeightLayout::kInterleaved16 && xq.empty()) {
      // Each row summed in Dot's order: the bits the rows layout gives here.
      internal::ScalarLevelKernels().dot_rows16({
          .wt = wt,
          .w = rows,
          .n_groups = n_out / 16,
          .x = x + t * n_in,
          .n = n_in,
          .y = y + t * n_out,
      });
      continue;
    }
    if (layout == WeightLayout::kInterleaved16) {
      ActCodeSums(xq.data(), static_cast<int64_t>(xq.size()), xsum.data());
      internal::ScalarLevelKernels().dot_act16({
          .wt = wt,
          .w = rows,
          .n_groups = n_out / 16,
          .xq = xq.data(),
          .xsum = xsum.data(),
          .xq_stride = n_in / kQK,
          .n_tok = 1,
          .n = n_in,
          .y = y + t * n_out,
          .y_stride = n_out,
      });
      continue;
    }
    for (int64_t o = 0; o < n_out; ++o) {
      y[t * n_out + o] = xq.empty() ? ref.dot(wt, rows + o * row_bytes, x + t * n_in, n_in)
                                    : ref.dot_act(wt, rows + o * row_bytes, xq.data(), n_in);
    }
  }
}

}  // namespace kvllm
