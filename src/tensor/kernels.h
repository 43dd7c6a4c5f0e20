// Compute kernels over rows of any DType against f32 activations. Each kernel has a scalar
// reference (`*_ref`, the oracle) and SIMD versions; `Kernels()` returns the best set this CPU
// supports, chosen once at run time. Tests compare every available set with the reference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "tensor/dtype.h"

namespace kvllm {

struct BlockQ8Act;

class ThreadPool;

enum class SimdLevel { kScalar = 0, kAvx2 = 1, kAvx512 = 2 };
const char* SimdLevelName(SimdLevel level);

// Memory a kernel asks the cache for while it works, one 64-byte line per step of its main loop
// (a row of V, a dimension of K): requests spread this way keep the core's few outstanding
// misses busy through the arithmetic, where a burst of them ahead of it stalls the loads
// behind it. A kernel advances `next` past the lines it asked for; the caller asks for any
// left over itself. With `far` > 0, each step also asks the L2 (not the L1) for the line
// `far` bytes beyond its own, which then waits in the L2 rather than in memory when its turn
// comes. Which lines the range holds is the caller's choice, by the level's prefetch_lead.
struct Prefetch {
  const uint8_t* next = nullptr;
  const uint8_t* end = nullptr;
  int64_t far = 0;
};

// Rows of a Q8_0 V that weighted_rows sums under one rounding of the weights: 256 products
// of 32767 * 127 stay inside an int32 sum.
constexpr int64_t kQ8VRunRows = 256;

// Function table for one SIMD level. `row` points at a row of n elements in `t`; n is a
// multiple of BlockElems(t) but need not be a multiple of the vector width.
struct KernelSet {
  SimdLevel level;
  // sum_j dequant(row)[j] * x[j]
  float (*dot)(DType t, const void* row, const float* x, int64_t n);
  // y[j] += a * dequant(row)[j]
  void (*axpy)(DType t, const void* row, float a, float* y, int64_t n);
  // y[j] = dequant(row)[j]
  void (*dequantize)(DType t, const void* row, float* y, int64_t n);
  // sum_j a[j] * b[j]
  float (*dot_f32)(const float* a, const float* b, int64_t n);
  // y[g][i] += sum_j p[g * p_stride + j] * v[j][i]  for g < n_g, j < n, i < d; v and y with
  // row stride d, v of type vt (F32, F16, BF16, or Q8_0 with d a multiple of 32; attention's
  // probabilities times V rows, read in place from the cache).
  // A Q8_0 V is summed in integers, as one 16-bit multiply-add takes a pair of rows; it needs
  // |p| <= 1 (softmax's numerators are). For each run of up to kQ8VRunRows rows and block
  // column b, with d_j row j's block scale and D = max_j |d_j| over the run, the weights
  // w_j = round(p_j * (d_j * (32767 / D))) fit 16 bits, and
  //   y[g][32b + i] = fma(f32(sum_j w_j * code_j[i]), D / 32767, y[g][32b + i]).
  // Rounding a weight moves its term by at most |code_j| * D / 65534, where rounding V to
  // codes already allowed |p_j * d_j| / 2. Every level computes these same bits.
  void (*weighted_rows)(const float* p, int64_t p_stride, int64_t n_g, DType vt, const void* v,
                        int64_t n, int64_t d, float* y, Prefetch* ahead);
  // x[j] = exp(x[j] - shift) for j < n; returns sum_j x[j] (softmax's numerators; x[j] <= shift
  // in use). Within a few ulps of std::exp.
  float (*exp_sum)(float* x, int64_t n, float shift);
  // max_j x[j] for j < n (n >= 1; the scores' max before exp_sum).
  float (*max_f32)(const float* x, int64_t n);
  // s[g * s_stride + j] = scale * sum_i q[g * d + i] * K[first + j][i]  for g < n_g, j < n,
  // i < d: attention scores against an f16 K stored dimension-major in tiles of ld slots
  // ([tile][d][ld] from k, so that a vector holds one dimension of many slots and the scores
  // need no horizontal sums). Slot t's dimension i is k[(t / ld) * ld * d + i * ld + t % ld]:
  // the n slots may run on from one tile into the ones after it (a run of adjacent blocks).
  void (*scores_f16t)(const uint16_t* k, int64_t ld, int64_t first, int64_t n, const float* q,
                      int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
                      Prefetch* ahead);
  // The same against a Q8_0 K stored dimension-major (Q8DimsLayout): for each group of 32
  // dimensions, ld f16 scales (one per slot), then 32 rows of ld int8 codes; the n slots start
  // at slot `first`. The query comes quantized as llama.cpp quantizes it for a q8_0 K
  // (quantize_act: head g's group b is q[g * d / 32 + b]), so that each group's sum is an
  // exact integer dot: s = scale * sum_b d[slot] * q.d * sum_i q.qs[i] * code[i][slot].
  // d is a multiple of 32.
  void (*scores_q8t)(const uint8_t* k, int64_t ld, int64_t first, int64_t n,
                     const BlockQ8Act* q, int64_t n_g, int64_t d, float scale, float* s,
                     int64_t s_stride, Prefetch* ahead);
  // xq = the n / 32 BlockQ8Act blocks of x (n a multiple of 32); the same bits at every level.
  void (*quantize_act)(const float* x, BlockQ8Act* xq, int64_t n);
  // sum_b d_w[b] * xq[b].d * sum_j q_w[b][j] * xq[b].qs[j]  (the integer dot per block is exact)
  // for t with UsesQ8Activations(t).
  float (*dot_act)(DType t, const void* row, const BlockQ8Act* xq, int64_t n);
  // gate[j] = silu(gate[j]) * up[j] = gate[j] / (1 + exp(-gate[j])) * up[j] for j < n (the
  // feed-forward's SwiGLU). Within a few ulps of std::exp's.
  void (*swiglu)(float* gate, const float* up, int64_t n);
  // y[j] = F32ToF16(x[j]) for j < n: round to nearest even, as F16C's conversion does, so
  // every level gives the same bits (f16 KV rows, written every token of every layer).
  void (*to_f16)(const float* x, uint16_t* y, int64_t n);
  // What attention gives scores_* and weighted_rows to ask for (Prefetch). 0: the data read
  // after theirs (the next chunk; `far` the one after that). > 0: these kernels ask for about
  // one line per 64 bytes they read, so they are given their own data, prefetch_lead bytes
  // ahead of where they read it, and `far` reaches the next chunk: the L1 then holds little
  // beyond what is read soon, where a whole next chunk asked into it pushed out the current
  // one before it was read.
  int64_t prefetch_lead;
};

// The best set this CPU supports (the environment variable KVLLM_SIMD=scalar|avx2|avx512 may
// lower the choice, for comparisons).
const KernelSet& Kernels();
// Every set this CPU can run, scalar first (for tests).
std::vector<const KernelSet*> AvailableKernelSets();
const KernelSet& ReferenceKernels();

// How the rows of a weight matrix lie in memory.
enum class WeightLayout : uint8_t {
  kRows,           // row after row, as a GGUF file stores them
  kInterleaved16,  // Q8_0, Q4_0, F16, BF16: 16 rows at a time (InterleaveRows, quant.h)
};
// Whether MatMul with the active kernels is faster on a matrix [n_out][n_in] of type t stored
// kInterleaved16: n_out a multiple of 16, and Q8_0, Q4_0, F16 or BF16 (n_in a multiple of 32)
// at the AVX-512 level, Q8_0 and Q4_0 at AVX2 (the types those levels have kernels for; the
// others would run the scalar one).
bool PrefersInterleaved(DType t, int64_t n_out, int64_t n_in);

// Y[t][o] = sum_i W[o][i] * X[t][i]
//   W: [n_out][n_in] rows of type wt (row stride RowBytes(wt, n_in))
//   X: [n_tok][n_in] f32, Y: [n_tok][n_out] f32
// Rows of W are split across the pool's threads. Float weights (f32, f16, bf16): with n_tok > 1
// each row of W is dequantized once, a slice of columns at a time, and reused for all the
// tokens (matrix x matrix), with n_tok == 1 it is a matrix x vector. Q8_0 and Q4_0 weights:
// each row of X is quantized once (BlockQ8Act) and every output is one dot_act, whatever
// n_tok is, so a token's result does not depend on the batch it came in; stored kInterleaved16, every
// output is the same sum block by block, acc = fma(f32(integer dot) * d_w, d_x, acc), which
// rounds differently from kRows's. F16 and BF16 stored kInterleaved16 give kRows's result
// with n_tok > 1 and a dot's rounding of it with n_tok == 1. After a thread's first call
// nothing is allocated.
// `pool` may be nullptr (runs on the calling thread).
void MatMul(DType wt, const void* w, int64_t n_out, int64_t n_in, const float* x, int64_t n_tok,
            float* y, ThreadPool* pool, WeightLayout layout = WeightLayout::kRows);
// One weight matrix of a MatMulShared call, W: [n_out][n_in] of type wt, and its product
// Y: [n_tok][n_out].
struct MatMulOut {
  DType wt;
  const void* w;
  int64_t n_out;
  float* y;
  WeightLayout layout = WeightLayout::kRows;
};
constexpr size_t kMaxSharedMatMuls = 4;
// MatMul of up to kMaxSharedMatMuls weight matrices with the same X (a layer's q, k and v;
// its gate and up): X is quantized once, and the matrices' tasks go to the pool together, so
// the threads meet once instead of once per matrix. Every Y is what MatMul gives, bit for bit.
void MatMulShared(std::span<const MatMulOut> outs, int64_t n_in, const float* x, int64_t n_tok,
                  ThreadPool* pool);
// Same contract as MatMul using the reference kernels on one thread (quantizing X the same
// way for Q8_0 and Q4_0 weights): the oracle for MatMul.
void MatMul_ref(DType wt, const void* w, int64_t n_out, int64_t n_in, const float* x,
                int64_t n_tok, float* y, WeightLayout layout = WeightLayout::kRows);

}  // namespace kvllm
