// AVX2 + FMA + F16C kernels. This file alone is compiled with those instruction sets enabled,
// so it must not define anything with external or vague linkage that other files could pick
// up (no std templates, no inline functions from shared headers): the linker might otherwise
// keep this file's copy and run AVX2 code on a CPU without it.
#include <immintrin.h>

#include <cstring>

#include "tensor/kernels_internal.h"
#include "tensor/quant.h"

namespace kvllm::internal {

namespace {

float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// Loaders of 8 consecutive elements of a float-type row, widened to f32.
struct F32Src {
  using Elem = float;
  static __m256 Load(const float* p) { return _mm256_loadu_ps(p); }
};

struct F16Src {
  using Elem = uint16_t;
  static __m256 Load(const uint16_t* p) {
    return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
};

struct BF16Src {
  using Elem = uint16_t;
  static __m256 Load(const uint16_t* p) {
    // bf16 is the top half of an f32.
    const __m256i wide =
        _mm256_cvtepu16_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
    return _mm256_castsi256_ps(_mm256_slli_epi32(wide, 16));
  }
};

// Loads the r < 8 elements left at the end of a row; the lanes above r are zero, so they add
// nothing to a sum. Tails are at most 7 elements, so the copy costs nothing measurable.
template <class Src>
__m256 LoadTail(const typename Src::Elem* p, int64_t r) {
  typename Src::Elem buf[8] = {};
  std::memcpy(buf, p, static_cast<size_t>(r) * sizeof(buf[0]));
  return Src::Load(buf);
}

void StoreTail(float* p, __m256 v, int64_t r) {
  float buf[8];
  _mm256_storeu_ps(buf, v);
  std::memcpy(p, buf, static_cast<size_t>(r) * sizeof(float));
}

template <class Src>
float DotFloat(const typename Src::Elem* a, const float* x, int64_t n) {
  // Four accumulators keep four FMA chains in flight to cover the FMA latency.
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  __m256 acc2 = _mm256_setzero_ps();
  __m256 acc3 = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + 32 <= n; i += 32) {
    acc0 = _mm256_fmadd_ps(Src::Load(a + i), _mm256_loadu_ps(x + i), acc0);
    acc1 = _mm256_fmadd_ps(Src::Load(a + i + 8), _mm256_loadu_ps(x + i + 8), acc1);
    acc2 = _mm256_fmadd_ps(Src::Load(a + i + 16), _mm256_loadu_ps(x + i + 16), acc2);
    acc3 = _mm256_fmadd_ps(Src::Load(a + i + 24), _mm256_loadu_ps(x + i + 24), acc3);
  }
  for (; i + 8 <= n; i += 8) {
    acc0 = _mm256_fmadd_ps(Src::Load(a + i), _mm256_loadu_ps(x + i), acc0);
  }
  if (i < n) {
    acc1 = _mm256_fmadd_ps(LoadTail<Src>(a + i, n - i), LoadTail<F32Src>(x + i, n - i), acc1);
  }
  return HSum(_mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3)));
}

template <class Src>
void AxpyFloat(const typename Src::Elem* a, float alpha, float* y, int64_t n) {
  const __m256 va = _mm256_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) {
    _mm256_storeu_ps(y + i, _mm256_fmadd_ps(Src::Load(a + i), va, _mm256_loadu_ps(y + i)));
  }
  if (i < n) {
    const __m256 sum =
        _mm256_fmadd_ps(LoadTail<Src>(a + i, n - i), va, LoadTail<F32Src>(y + i, n - i));
    StoreTail(y + i, sum, n - i);
  }
}

template <class Src>
void DequantizeFloat(const typename Src::Elem* a, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8) _mm256_storeu_ps(y + i, Src::Load(a + i));
  if (i < n) StoreTail(y + i, LoadTail<Src>(a + i, n - i), n - i);
}

// Sign-extends the low 8 bytes of v to f32 lanes.
__m256 I8ToF32(__m128i v) { return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(v)); }

// Unpackers of one block's 32 quants into 4 vectors of 8 unscaled f32 values, elements in
// order, so callers only multiply by the block scale d.
struct Q8_0Src {
  using Block = BlockQ8_0;
  static void Unpack(const BlockQ8_0& b, __m256 q[4]) {
    for (int k = 0; k < 4; ++k) {
      q[k] = I8ToF32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(b.qs + 8 * k)));
    }
  }
};

struct Q4_0Src {
  using Block = BlockQ4_0;
  static void Unpack(const BlockQ4_0& b, __m256 q[4]) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    const __m128i eight = _mm_set1_epi8(8);
    // Byte j holds element j in its low nibble and element j + 16 in its high nibble.
    const __m128i lo = _mm_sub_epi8(_mm_and_si128(packed, low_nibble), eight);
    const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_nibble), eight);
    q[0] = I8ToF32(lo);
    q[1] = I8ToF32(_mm_unpackhi_epi64(lo, lo));
    q[2] = I8ToF32(hi);
    q[3] = I8ToF32(_mm_unpackhi_epi64(hi, hi));
  }
};

float Scale(uint16_t d) { return _cvtsh_ss(d); }

// Unscaled dot of one block's quants with 32 elements of x.
template <class Src>
__m256 BlockDot(const typename Src::Block& b, const float* x) {
  __m256 q[4];
  Src::Unpack(b, q);
  const __m256 s01 =
      _mm256_fmadd_ps(q[1], _mm256_loadu_ps(x + 8), _mm256_mul_ps(q[0], _mm256_loadu_ps(x)));
  const __m256 s23 =
      _mm256_fmadd_ps(q[3], _mm256_loadu_ps(x + 24), _mm256_mul_ps(q[2], _mm256_loadu_ps(x + 16)));
  return _mm256_add_ps(s01, s23);
}

template <class Src>
float DotBlocks(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const typename Src::Block*>(row);
  const int64_t nb = n / kQK;
  // Two accumulators so consecutive blocks' final FMAs do not wait on each other.
  __m256 acc0 = _mm256_setzero_ps();
  __m256 acc1 = _mm256_setzero_ps();
  int64_t ib = 0;
  for (; ib + 2 <= nb; ib += 2) {
    acc0 =
        _mm256_fmadd_ps(BlockDot<Src>(b[ib], x + ib * kQK), _mm256_set1_ps(Scale(b[ib].d)), acc0);
    acc1 = _mm256_fmadd_ps(BlockDot<Src>(b[ib + 1], x + (ib + 1) * kQK),
                           _mm256_set1_ps(Scale(b[ib + 1].d)), acc1);
  }
  if (ib < nb) {
    acc0 =
        _mm256_fmadd_ps(BlockDot<Src>(b[ib], x + ib * kQK), _mm256_set1_ps(Scale(b[ib].d)), acc0);
  }
  return HSum(_mm256_add_ps(acc0, acc1));
}

template <class Src>
void AxpyBlocks(const void* row, float a, float* y, int64_t n) {
  const auto* b = static_cast<const typename Src::Block*>(row);
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    __m256 q[4];
    Src::Unpack(b[ib], q);
    const __m256 scale = _mm256_set1_ps(a * Scale(b[ib].d));
    float* yb = y + ib * kQK;
    for (int k = 0; k < 4; ++k) {
      _mm256_storeu_ps(yb + 8 * k, _mm256_fmadd_ps(q[k], scale, _mm256_loadu_ps(yb + 8 * k)));
    }
  }
}

template <class Src>
void DequantizeBlocks(const void* row, float* y, int64_t n) {
  const auto* b = static_cast<const typename Src::Block*>(row);
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    __m256 q[4];
    Src::Unpack(b[ib], q);
    const __m256 d = _mm256_set1_ps(Scale(b[ib].d));
    for (int k = 0; k < 4; ++k) _mm256_storeu_ps(y + ib * kQK + 8 * k, _mm256_mul_ps(q[k], d));
  }
}

float Dot(DType t, const void* row, const float* x, int64_t n) {
  switch (t) {
    case DType::kF32:
      return DotFloat<F32Src>(static_cast<const float*>(row), x, n);
    case DType::kF16:
      return DotFloat<F16Src>(static_cast<const uint16_t*>(row), x, n);
    case DType::kBF16:
      return DotFloat<BF16Src>(static_cast<const uint16_t*>(row), x, n);
    case DType::kQ8_0:
      return DotBlocks<Q8_0Src>(row, x, n);
    case DType::kQ4_0:
      break;
  }
  return DotBlocks<Q4_0Src>(row, x, n);
}

void Axpy(DType t, const void* row, float a, float* y, int64_t n) {
  switch (t) {
    case DType::kF32:
      return AxpyFloat<F32Src>(static_cast<const float*>(row), a, y, n);
    case DType::kF16:
      return AxpyFloat<F16Src>(static_cast<const uint16_t*>(row), a, y, n);
    case DType::kBF16:
      return AxpyFloat<BF16Src>(static_cast<const uint16_t*>(row), a, y, n);
    case DType::kQ8_0:
      return AxpyBlocks<Q8_0Src>(row, a, y, n);
    case DType::kQ4_0:
      break;
  }
  AxpyBlocks<Q4_0Src>(row, a, y, n);
}

void Dequantize(DType t, const void* row, float* y, int64_t n) {
  switch (t) {
    case DType::kF32:
      return DequantizeFloat<F32Src>(static_cast<const float*>(row), y, n);
    case DType::kF16:
      return DequantizeFloat<F16Src>(static_cast<const uint16_t*>(row), y, n);
    case DType::kBF16:
      return DequantizeFloat<BF16Src>(static_cast<const uint16_t*>(row), y, n);
    case DType::kQ8_0:
      return DequantizeBlocks<Q8_0Src>(row, y, n);
    case DType::kQ4_0:
      break;
  }
  DequantizeBlocks<Q4_0Src>(row, y, n);
}

float DotF32(const float* a, const float* b, int64_t n) { return DotFloat<F32Src>(a, b, n); }

// R weight rows x T tokens: each x vector is loaded once for R FMAs and each w vector once
// for T, with R * T independent accumulators. 4 x 2 uses 8 accumulators + 4 w + 2 x of the 16
// ymm registers.
template <int R, int T>
void TileKernel(const TileArgs& a, const float* x, float* y) {
  __m256 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm256_setzero_ps();
  }
  int64_t i = 0;
  for (; i + 8 <= a.n; i += 8) {
    __m256 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = _mm256_loadu_ps(x + t * a.x_stride + i);
    for (int r = 0; r < R; ++r) {
      __m256 wv = _mm256_loadu_ps(a.w + r * a.w_stride + i);
      // Pins wv in a register. Otherwise GCC folds the load into each of the T FMAs, loading
      // w T times, and the loop becomes load bound (measured ~18% slower on Zen).
      __asm__("" : "+x"(wv));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm256_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      float sum = HSum(acc[r][t]);
      for (int64_t j = i; j < a.n; ++j) sum += a.w[r * a.w_stride + j] * x[t * a.x_stride + j];
      float& out = y[t * a.y_stride + r];
      out = a.accumulate ? out + sum : sum;
    }
  }
}

template <int R>
void DotTileRows(const TileArgs& a) {
  int64_t t = 0;
  for (; t + 2 <= a.n_tok; t += 2) TileKernel<R, 2>(a, a.x + t * a.x_stride, a.y + t * a.y_stride);
  if (t < a.n_tok) TileKernel<R, 1>(a, a.x + t * a.x_stride, a.y + t * a.y_stride);
}

void DotTile(const TileArgs& a) {
  static_assert(kTileRows == 4);
  switch (a.n_rows) {
    case 4:
      return DotTileRows<4>(a);
    case 3:
      return DotTileRows<3>(a);
    case 2:
      return DotTileRows<2>(a);
    default:
      return DotTileRows<1>(a);
  }
}

}  // namespace

const LevelKernels& Avx2LevelKernels() {
  static constexpr LevelKernels kLevel = {
      {SimdLevel::kAvx2, &Dot, &Axpy, &Dequantize, &DotF32},
      &DotTile,
  };
  return kLevel;
}

}  // namespace kvllm::internal
