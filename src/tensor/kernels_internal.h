// Per-SIMD-level kernel tables, shared by kernels.cc (dispatch and MatMul) and the files that
// implement one level each. Not part of the public API.
#pragma once

#include <cstdint>
#include <vector>

#include "tensor/kernels.h"
#include "tensor/quant.h"

namespace kvllm::internal {

// Most weight rows one DotTile call takes.
constexpr int kTileRows = 4;

// The prefill micro-kernel, on f32 sub-matrices given by pointer and row stride:
//   y[t * y_stride + r] (+)= sum_{i < n} w[r * w_stride + i] * x[t * x_stride + i]
// for r < n_rows (1..kTileRows) and t < n_tok; `accumulate` adds to y instead of storing.
// Each loaded x vector is reused across the n_rows weight rows.
struct TileArgs {
  const float* w;
  int64_t w_stride;
  int n_rows;
  const float* x;
  int64_t x_stride;
  int64_t n_tok;
  int64_t n;
  float* y;
  int64_t y_stride;
  bool accumulate;
};
using DotTileFn = void (*)(const TileArgs& args);

// The same for Q8_0 / Q4_0 weight rows against quantized activations:
//   y[t * y_stride + r] = dot_act(wt, w + r * row_bytes, xq + t * xq_stride, n)
// for r < n_rows (1..kTileRows, or any number when n_tok is 1) and t < n_tok, each
// bit-identical to that dot_act call, so a token's result does not depend on how many tokens
// share the tile.
struct ActTileArgs {
  DType wt;
  const uint8_t* w;
  size_t row_bytes;
  int n_rows;
  const BlockQ8Act* xq;
  int64_t xq_stride;  // blocks
  int64_t n_tok;
  int64_t n;
  float* y;
  int64_t y_stride;
};
using DotActTileFn = void (*)(const ActTileArgs& args);

// Decode with float-type weights (f32, f16, bf16), one token:
//   y[r] = sum_{i < n} dequant(w + r * row_bytes)[i] * x[i]   for r < n_rows
// to within a dot's rounding (the order of the sum is the level's). Several rows at a time
// share each loaded x vector and keep enough sums in flight to hide the FMA latency, which
// row-at-a-time dots (one HSum per 4 KiB row) do not.
struct RowsArgs {
  DType wt;
  const uint8_t* w;
  size_t row_bytes;
  int64_t n_rows;
  const float* x;
  int64_t n;
  float* y;
};
using DotRowsFn = void (*)(const RowsArgs& args);

// F16 / BF16 weights stored WeightLayout::kInterleaved16, one token: n_groups groups of 16
// rows from w, y[16 * g + r] = sum_{i < n} w_r[i] * x[i] for r < 16, to within a dot's
// rounding (the order of the sum is the level's). n is a multiple of 32.
struct Rows16Args {
  DType wt;
  const uint8_t* w;
  int64_t n_groups;
  const float* x;
  int64_t n;
  float* y;
};
using DotRows16Fn = void (*)(const Rows16Args& args);
// The same weights' 16 rows of one group from `group`, its chunks first_chunk ..
// first_chunk + n_chunks - 1 of 32 columns (lying where `order` puts them) widened to f32:
// out[r * out_stride + 32 * c + j] for chunk first_chunk + c (prefill's dequantized slice).
using Widen16Fn = void (*)(DType wt, const uint8_t* group, const FloatChunkOrder& order,
                           int64_t first_chunk, int64_t n_chunks, float* out,
                           int64_t out_stride);

// Q8_0 / Q4_0 weights stored WeightLayout::kInterleaved16 against quantized activations:
// n_groups groups of 16 rows from w, and for g < n_groups, r < 16, t < n_tok
//   y[t * y_stride + 16 * g + r] = acc, where acc = 0, then for each block b in order
//   acc = fma(f32(sum_j q[j] * xq[t * xq_stride + b].qs[j]) * d_w, xq[...].d, acc)
// (q and d_w row r's in block b): one rounding order for every level and batch size.
// xsum[t * xq_stride + b] = sum_j xq[t * xq_stride + b].qs[j], which lets a kernel multiply
// offset codes (unsigned) and take the offset off once per block.
struct Act16Args {
  DType wt;
  const uint8_t* w;
  int64_t n_groups;
  const BlockQ8Act* xq;
  const int32_t* xsum;
  int64_t xq_stride;  // blocks
  int64_t n_tok;
  int64_t n;
  float* y;
  int64_t y_stride;
};
using DotAct16Fn = void (*)(const Act16Args& args);

// Calls strip.template operator()<G>(g) over n_g query heads in groups of G = kMax (8 or 4),
// then one group each of the smaller powers of 2 as needed: the SIMD score kernels keep G
// accumulators (or G per slot vector) in registers. Instantiated only with each kernel file's
// own lambdas, so every ISA gets its own copy.
template <int kMax = 8, class Strip>
void ByHeadGroups(int64_t n_g, const Strip& strip) {
  static_assert(kMax == 8 || kMax == 4);
  int64_t g = 0;
  for (; g + kMax <= n_g; g += kMax) strip.template operator()<kMax>(g);
  if constexpr (kMax == 8) {
    if (g + 4 <= n_g) {
      strip.template operator()<4>(g);
      g += 4;
    }
  }
  if (g + 2 <= n_g) {
    strip.template operator()<2>(g);
    g += 2;
  }
  if (g < n_g) strip.template operator()<1>(g);
}

struct LevelKernels {
  KernelSet set;  // what Kernels() hands out
  DotTileFn dot_tile;
  DotRowsFn dot_rows;
  DotActTileFn dot_act_tile;
  DotRows16Fn dot_rows16;
  Widen16Fn widen16;
  DotAct16Fn dot_act16;
};

const LevelKernels& ScalarLevelKernels();
// Only callable when the CPU has AVX2, FMA and F16C.
const LevelKernels& Avx2LevelKernels();
// Only callable when the CPU (and OS) have AVX-512 F, BW, VL, DQ and VNNI.
const LevelKernels& Avx512LevelKernels();

// Every level this CPU can run, scalar first.
std::vector<const LevelKernels*> AvailableLevelKernels();

// MatMul (kernels.h) with the given level's kernels instead of the active one, so that tests
// can run every level's tiles whichever is active.
void MatMulWith(const LevelKernels& kernels, DType wt, const void* w, int64_t n_out, int64_t n_in,
                const float* x, int64_t n_tok, float* y, ThreadPool* pool,
                WeightLayout layout = WeightLayout::kRows);
void MatMulSharedWith(const LevelKernels& kernels, std::span<const MatMulOut> outs, int64_t n_in,
                      const float* x, int64_t n_tok, ThreadPool* pool);

// The best level of `supported` that the KVLLM_SIMD value `env` (nullptr when unset) allows.
// Unknown values leave `supported` unchanged.
SimdLevel ChooseSimdLevel(SimdLevel supported, const char* env);

}  // namespace kvllm::internal
