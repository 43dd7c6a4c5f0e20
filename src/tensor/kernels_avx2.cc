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

// An empty asm that GCC must assume changes v: v is computed in full at this point and held
// in a register. Where GCC instead folded a load into every use of v, or reassociated sums
// into trees that needed more registers than AVX2 has (spilling accumulators to the stack, a
// store and a load on their chains), the kernels below ran slower (each says by how much).
template <class V>
void InRegister(V& v) {
  __asm__("" : "+x"(v));
}

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

// The lines of a Prefetch still to ask for, kept in registers through a kernel's loops: Step()
// asks for one.
struct Ahead {
  const uint8_t* next;
  const uint8_t* end;
  int64_t far;
  explicit Ahead(const Prefetch* p)
      : next(p ? p->next : nullptr), end(p ? p->end : nullptr), far(p ? p->far : 0) {}
  void Step() {
    if (next < end) {
      _mm_prefetch(reinterpret_cast<const char*>(next), _MM_HINT_T0);
      // With no far range (far 0) the same line again: cheaper than a branch on far.
      _mm_prefetch(reinterpret_cast<const char*>(next + far), _MM_HINT_T1);
      next += 64;
    }
  }
  void Return(Prefetch* p) const {
    if (p) p->next = next;
  }
  // body(i) for i < n, asking for a line before every two: a step before each one left the
  // strips' loops bound by dispatching the step's test and branch, not by their FMAs.
  template <class Body>
  void EveryTwo(int64_t n, const Body& body) {
    int64_t i = 0;
    for (; i + 2 <= n; i += 2) {
      Step();
      body(i);
      body(i + 1);
    }
    if (i < n) {
      Step();
      body(i);
    }
  }
};

// G heads' y over 4 vectors of 8 columns stay in registers while every row of v adds into
// them: each v vector loaded (and widened from Src's type) serves G FMAs, and 4 * G independent
// chains cover the FMA latency.
template <class Src, int G>
void WeightedStrip(const float* p, int64_t p_stride, const typename Src::Elem* v, int64_t n,
                   int64_t d, float* y, Ahead& ahead) {
  __m256 acc[G][4];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 4; ++c) acc[g][c] = _mm256_loadu_ps(y + g * d + 8 * c);
  }
  auto row = [&](int64_t j) {
    __m256 vj[4];
    for (int c = 0; c < 4; ++c) vj[c] = Src::Load(v + j * d + 8 * c);
    for (int g = 0; g < G; ++g) {
      const __m256 pj = _mm256_set1_ps(p[g * p_stride + j]);
      for (int c = 0; c < 4; ++c) acc[g][c] = _mm256_fmadd_ps(pj, vj[c], acc[g][c]);
    }
  };
  // A line per two rows: the strips of a call together ask for more lines than they read.
  ahead.EveryTwo(n, row);
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 4; ++c) _mm256_storeu_ps(y + g * d + 8 * c, acc[g][c]);
  }
}

// Columns of one head past the 32-column strips: 8 at a time, then the tail.
template <class Src>
void WeightedColumns(const float* pg, const typename Src::Elem* v, int64_t n, int64_t d,
                     int64_t i, float* yg) {
  for (; i + 8 <= d; i += 8) {
    __m256 acc = _mm256_loadu_ps(yg + i);
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(pg[j]), Src::Load(v + j * d + i), acc);
    }
    _mm256_storeu_ps(yg + i, acc);
  }
  if (i < d) {
    const int64_t r = d - i;
    __m256 acc = LoadTail<F32Src>(yg + i, r);
    for (int64_t j = 0; j < n; ++j) {
      acc = _mm256_fmadd_ps(_mm256_set1_ps(pg[j]), LoadTail<Src>(v + j * d + i, r), acc);
    }
    StoreTail(yg + i, acc, r);
  }
}

// Pairs of heads through strips of 32 columns (8 chains), a last odd head alone.
template <class Src>
void WeightedRowsOf(const float* p, int64_t p_stride, int64_t n_g, const void* v_bytes,
                    int64_t n, int64_t d, float* y, Prefetch* prefetch) {
  const auto* v = static_cast<const typename Src::Elem*>(v_bytes);
  Ahead ahead(prefetch);
  const int64_t strips = d / 32 * 32;
  int64_t g = 0;
  for (; g + 2 <= n_g; g += 2) {
    for (int64_t i = 0; i < strips; i += 32) {
      WeightedStrip<Src, 2>(p + g * p_stride, p_stride, v + i, n, d, y + g * d + i, ahead);
    }
  }
  for (; g < n_g; ++g) {
    for (int64_t i = 0; i < strips; i += 32) {
      WeightedStrip<Src, 1>(p + g * p_stride, p_stride, v + i, n, d, y + g * d + i, ahead);
    }
  }
  for (g = 0; g < n_g; ++g) {
    WeightedColumns<Src>(p + g * p_stride, v, n, d, strips, y + g * d);
  }
  ahead.Return(prefetch);
}

// One head's weights for one block column of a run of Q8_0 V rows, as kernels_avx512.cc's
// Q8VWeights (kernels.h): w[j] = round(p[j] * dw[j]), w[len] = 0. Whole vectors are read and
// written in place; only the tail goes through zeroed copies (a vector read from a buffer just
// written by smaller stores waits for them: through copies everywhere this took more time
// than the weighted sum itself, BM_AttentionStep q8_0).
void Q8VWeights(const float* p, const float* dw, int64_t len, int16_t* w) {
  // |p * dw| <= 32767 * (1 + 2^-23): the rounded weight fits 16 bits.
  auto weights = [](__m256 pj, __m256 dj) {
    const __m256i wj = _mm256_cvtps_epi32(_mm256_mul_ps(pj, dj));
    return _mm_packs_epi32(_mm256_castsi256_si128(wj), _mm256_extracti128_si256(wj, 1));
  };
  int64_t j = 0;
  for (; j + 8 <= len; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(w + j),
                     weights(_mm256_loadu_ps(p + j), _mm256_loadu_ps(dw + j)));
  }
  if (j < len) {
    const int64_t m = len - j;
    float pb[8] = {}, db[8] = {};
    std::memcpy(pb, p + j, static_cast<size_t>(m) * sizeof(float));
    std::memcpy(db, dw + j, static_cast<size_t>(m) * sizeof(float));
    int16_t wb[8];
    _mm_storeu_si128(reinterpret_cast<__m128i*>(wb),
                     weights(_mm256_loadu_ps(pb), _mm256_loadu_ps(db)));
    std::memcpy(w + j, wb, static_cast<size_t>(m) * sizeof(w[0]));
  }
  w[len] = 0;
}

// G heads' 32 output columns of one Q8_0 block column of V over a run of len rows, in
// integers as in kernels_avx512.cc's Q8VStrip: rows j and j + 1 widened to 16 bits and
// interleaved, so that vpmaddwd adds w[j] * code_j + w[j + 1] * code_j+1 into 8 int32 lanes.
// Each 16-column half c leaves columns {0-3, 8-11} in acc[g][2c] and {4-7, 12-15} in
// acc[g][2c + 1], put back in order at the end.
template <int G>
void Q8VStrip(const int16_t (*w)[kQ8VRunRows + 2], float unscale, const uint8_t* v,
              int64_t row_bytes, int64_t len, int64_t d, float* y, Ahead& ahead) {
  __m256i acc[G][4];
  for (int g = 0; g < G; ++g) {
    for (int k = 0; k < 4; ++k) acc[g][k] = _mm256_setzero_si256();
  }
  auto codes = [&](int64_t j, int c) {
    const auto& block = *reinterpret_cast<const BlockQ8_0*>(v + j * row_bytes);
    return _mm256_cvtepi8_epi16(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(block.qs + 16 * c)));
  };
  for (int64_t j = 0; j < len; j += 2) {
    ahead.Step();  // a line per two rows: a call's strips ask for 4 times the run's lines
    __m256i pairs[4];
    for (int c = 0; c < 2; ++c) {
      const __m256i a = codes(j, c);
      const __m256i b = j + 1 < len ? codes(j + 1, c) : _mm256_setzero_si256();
      pairs[2 * c] = _mm256_unpacklo_epi16(a, b);
      pairs[2 * c + 1] = _mm256_unpackhi_epi16(a, b);
    }
    for (int g = 0; g < G; ++g) {
      int32_t pair;
      std::memcpy(&pair, w[g] + j, sizeof(pair));
      const __m256i wp = _mm256_set1_epi32(pair);
      for (int k = 0; k < 4; ++k) {
        acc[g][k] = _mm256_add_epi32(acc[g][k], _mm256_madd_epi16(pairs[k], wp));
      }
    }
  }
  const __m256 u = _mm256_set1_ps(unscale);
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < 2; ++c) {
      const __m256i lo = acc[g][2 * c], hi = acc[g][2 * c + 1];
      float* out = y + g * d + 16 * c;
      const __m256i s0 = _mm256_permute2x128_si256(lo, hi, 0x20);  // columns 0-7
      const __m256i s1 = _mm256_permute2x128_si256(lo, hi, 0x31);  // columns 8-15
      _mm256_storeu_ps(out, _mm256_fmadd_ps(_mm256_cvtepi32_ps(s0), u, _mm256_loadu_ps(out)));
      _mm256_storeu_ps(out + 8,
                       _mm256_fmadd_ps(_mm256_cvtepi32_ps(s1), u, _mm256_loadu_ps(out + 8)));
    }
  }
}

// Pairs of heads (8 accumulators), a last odd head alone, one block column at a time.
void WeightedRowsQ8(const float* p, int64_t p_stride, int64_t n_g, const void* v, int64_t n,
                    int64_t d, float* y, Prefetch* prefetch) {
  const auto* rows = static_cast<const uint8_t*>(v);
  const int64_t row_bytes = d / kQK * static_cast<int64_t>(sizeof(BlockQ8_0));
  Ahead ahead(prefetch);
  alignas(32) float dw[kQ8VRunRows];
  alignas(32) uint16_t dh[kQ8VRunRows];  // the run's scales of one block column, as stored
  alignas(32) int16_t w[2][kQ8VRunRows + 2];
  for (int64_t r0 = 0; r0 < n; r0 += kQ8VRunRows) {
    const int64_t len = n - r0 < kQ8VRunRows ? n - r0 : kQ8VRunRows;
    const uint8_t* run = rows + r0 * row_bytes;
    for (int64_t b = 0; b < d / kQK; ++b) {
      const uint8_t* col = run + b * static_cast<int64_t>(sizeof(BlockQ8_0));
      // The largest |scale| from the bits: without the sign, f16 bits order as their values
      // do. The scales become floats 8 at a time (one at a time, with the max on floats, this
      // loop took a seventh of the weighted sum).
      uint16_t dmax_bits = 0;
      for (int64_t j = 0; j < len; ++j) {
        dh[j] = reinterpret_cast<const BlockQ8_0*>(col + j * row_bytes)->d;
        const uint16_t a = dh[j] & 0x7fff;
        dmax_bits = a > dmax_bits ? a : dmax_bits;
      }
      if (dmax_bits == 0) continue;  // every weight is 0: y stays
      const float dmax = Scale(dmax_bits);
      const __m256 to_int = _mm256_set1_ps(32767.0f / dmax);
      for (int64_t j = len; j % 8 != 0; ++j) dh[j] = 0;
      for (int64_t j = 0; j < len; j += 8) {
        const __m128i h = _mm_load_si128(reinterpret_cast<const __m128i*>(dh + j));
        _mm256_store_ps(dw + j, _mm256_mul_ps(_mm256_cvtph_ps(h), to_int));
      }
      const float unscale = dmax / 32767.0f;
      float* yb = y + b * kQK;
      int64_t g = 0;
      for (; g + 2 <= n_g; g += 2) {
        for (int k = 0; k < 2; ++k) Q8VWeights(p + (g + k) * p_stride + r0, dw, len, w[k]);
        Q8VStrip<2>(w, unscale, col, row_bytes, len, d, yb + g * d, ahead);
      }
      if (g < n_g) {
        Q8VWeights(p + g * p_stride + r0, dw, len, w[0]);
        Q8VStrip<1>(w, unscale, col, row_bytes, len, d, yb + g * d, ahead);
      }
    }
  }
  ahead.Return(prefetch);
}

void WeightedRows(const float* p, int64_t p_stride, int64_t n_g, DType vt, const void* v,
                  int64_t n, int64_t d, float* y, Prefetch* ahead) {
  switch (vt) {
    case DType::kF16:
      return WeightedRowsOf<F16Src>(p, p_stride, n_g, v, n, d, y, ahead);
    case DType::kBF16:
      return WeightedRowsOf<BF16Src>(p, p_stride, n_g, v, n, d, y, ahead);
    case DType::kQ8_0:
      return WeightedRowsQ8(p, p_stride, n_g, v, n, d, y, ahead);
    default:
      return WeightedRowsOf<F32Src>(p, p_stride, n_g, v, n, d, y, ahead);
  }
}

// exp(x) for x in [-87.3, 88], where 2^k stays a normal float, as 2^k * e^r with k = round(x /
// ln 2) and |r| <= ln(2) / 2: r is x - k ln 2 with ln 2 split in two so that k ln 2 is exact,
// e^r is 1 + r + r^2 p(r) with the degree-5 minimax p of the Cephes library's expf. k + 127
// comes out of one FMA as the low bits of t = x / ln 2 + 1.5 * 2^23 + 127 (floats there are
// whole numbers), which shifted into the exponent field are 2^k.
__m256 ExpInRange(__m256 x) {
  const __m256 magic = _mm256_set1_ps(12583039.0f);  // 1.5 * 2^23 + 127
  const __m256 t = _mm256_fmadd_ps(x, _mm256_set1_ps(1.44269504088896341f), magic);
  const __m256 k = _mm256_sub_ps(t, magic);
  __m256 r = _mm256_fnmadd_ps(k, _mm256_set1_ps(0.693359375f), x);
  r = _mm256_fnmadd_ps(k, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  const __m256 e_r =
      _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  return _mm256_mul_ps(e_r, _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_castps_si256(t), 23)));
}

// Below -87.3 e^x is 2^-126 at most (a normal float stands for it), above 88 it overflows.
__m256 ClampForExp(__m256 x) { return _mm256_max_ps(x, _mm256_set1_ps(-87.33654f)); }

__m256 Exp(__m256 x) { return ExpInRange(_mm256_min_ps(ClampForExp(x), _mm256_set1_ps(88.0f))); }

void SwiGlu(float* gate, const float* up, int64_t n) {
  const __m256 one = _mm256_set1_ps(1.0f);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    const __m256 g = _mm256_loadu_ps(gate + j);
    const __m256 e = Exp(_mm256_sub_ps(_mm256_setzero_ps(), g));
    const __m256 silu = _mm256_div_ps(g, _mm256_add_ps(one, e));
    _mm256_storeu_ps(gate + j, _mm256_mul_ps(silu, _mm256_loadu_ps(up + j)));
  }
  if (j < n) {  // the last n % 8 through a buffer: no access past either array's end
    float g[8] = {}, u[8] = {};
    std::memcpy(g, gate + j, (n - j) * sizeof(float));
    std::memcpy(u, up + j, (n - j) * sizeof(float));
    SwiGlu(g, u, 8);
    std::memcpy(gate + j, g, (n - j) * sizeof(float));
  }
}

void ToF16(const float* x, uint16_t* y, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    _mm_storeu_si128(reinterpret_cast<__m128i*>(y + j),
                     _mm256_cvtps_ph(_mm256_loadu_ps(x + j), kRound));
  }
  if (j < n) {  // the last n % 8 through a buffer: no access past either array's end
    float in[8] = {};
    uint16_t out[8];
    std::memcpy(in, x + j, (n - j) * sizeof(float));
    ToF16(in, out, 8);
    std::memcpy(y + j, out, (n - j) * sizeof(uint16_t));
  }
}

float ExpSum(float* x, int64_t n, float shift) {
  const __m256 vshift = _mm256_set1_ps(shift);
  __m256 sum = _mm256_setzero_ps();
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) {
    // x[j] <= shift: only the lower clamp.
    const __m256 e = ExpInRange(ClampForExp(_mm256_sub_ps(_mm256_loadu_ps(x + j), vshift)));
    _mm256_storeu_ps(x + j, e);
    sum = _mm256_add_ps(sum, e);
  }
  float total = HSum(sum);
  if (j < n) {
    float e[8];
    _mm256_storeu_ps(e, Exp(_mm256_sub_ps(LoadTail<F32Src>(x + j, n - j), vshift)));
    for (int64_t i = 0; j + i < n; ++i) total += (x[j + i] = e[i]);
  }
  return total;
}

float MaxF32(const float* x, int64_t n) {
  __m256 m = _mm256_set1_ps(x[0]);
  int64_t j = 0;
  for (; j + 8 <= n; j += 8) m = _mm256_max_ps(m, _mm256_loadu_ps(x + j));
  float lanes[8];
  _mm256_storeu_ps(lanes, m);
  float out = lanes[0];
  for (int i = 1; i < 8; ++i) out = out > lanes[i] ? out : lanes[i];
  for (; j < n; ++j) out = out > x[j] ? out : x[j];
  return out;
}

// s[g * s_stride + j] = scale * acc[g][j] (plus what s held, with `add`) for the strip's
// r <= 8 slots.
template <int G>
void StoreScores(const __m256 (&acc)[G], int64_t r, float scale, float* s, int64_t s_stride,
                 bool add = false) {
  const __m256 vscale = _mm256_set1_ps(scale);
  for (int g = 0; g < G; ++g) {
    float* sg = s + g * s_stride;
    if (r == 8) {
      const __m256 base = add ? _mm256_loadu_ps(sg) : _mm256_setzero_ps();
      _mm256_storeu_ps(sg, _mm256_fmadd_ps(acc[g], vscale, base));
    } else {
      const __m256 base = add ? LoadTail<F32Src>(sg, r) : _mm256_setzero_ps();
      StoreTail(sg, _mm256_fmadd_ps(acc[g], vscale, base), r);
    }
  }
}

// Dimensions of the query ScoresF16T holds transposed at a time, for up to 8 heads (4 KiB).
constexpr int64_t kQtDims = 128;

// G query heads against 8 * S slots (S vectors of 8 lanes; a last strip of r < 8 slots, S = 1,
// goes through a zeroed copy) over `dims` dimensions. The heads' query comes dimension-major,
// qt[i * 8 + g], so that one pointer with constant offsets serves all G broadcasts. Each
// broadcast feeds S FMAs: with 8 heads against 8 slots, one broadcast an FMA, the broadcasts
// set the pace at 48% of the FMA peak; 4 heads against 16 slots reach 69-74%
// (BM_AttentionKernels/part:0 on Zen 3). G * S accumulators, 8, cover the FMA latency.
template <int G, int S, bool kFull>
void ScoresStrip(const uint16_t* k, int64_t ld, int64_t r, const float* qt, int64_t dims,
                 float scale, float* s, int64_t s_stride, bool add, Ahead& ahead) {
  __m256 acc[S][G];
  for (int v = 0; v < S; ++v) {
    for (int g = 0; g < G; ++g) acc[v][g] = _mm256_setzero_ps();
  }
  auto dim = [&](int64_t i) {
    __m256 kv[S];
    for (int v = 0; v < S; ++v) {
      kv[v] = kFull ? F16Src::Load(k + i * ld + 8 * v) : LoadTail<F16Src>(k + i * ld, r);
    }
    const float* qi = qt + i * 8;
    for (int g = 0; g < G; ++g) {
      const __m256 qg = _mm256_set1_ps(qi[g]);
      for (int v = 0; v < S; ++v) acc[v][g] = _mm256_fmadd_ps(qg, kv[v], acc[v][g]);
    }
  };
  // A line per two dimensions asks for at least the lines a strip reads (16 slots of f16).
  ahead.EveryTwo(dims, dim);
  for (int v = 0; v < S; ++v) {
    StoreScores<G>(acc[v], S == 1 ? r : 8, scale, s + 8 * v, s_stride, add);
  }
}

// Up to 8 heads and kQtDims dimensions at a time, transposed once for all strips, each within
// one tile: 16 slots where a tile has them, 4 heads at a time, else up to 8 slots and 8 heads.
// A head dimension past kQtDims adds into the scores.
void ScoresF16T(const uint16_t* k, int64_t ld, int64_t first, int64_t n, const float* q,
                int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
                Prefetch* prefetch) {
  Ahead ahead(prefetch);
  alignas(32) float qt[kQtDims * 8];
  for (int64_t h0 = 0; h0 < n_g; h0 += 8) {
    const int64_t heads = n_g - h0 < 8 ? n_g - h0 : 8;
    for (int64_t i0 = 0; i0 < d; i0 += kQtDims) {
      const int64_t dims = d - i0 < kQtDims ? d - i0 : kQtDims;
      const bool add = i0 > 0;
      for (int64_t g = 0; g < heads; ++g) {
        for (int64_t i = 0; i < dims; ++i) qt[i * 8 + g] = q[(h0 + g) * d + i0 + i];
      }
      for (int64_t j = 0; j < n;) {
        const int64_t t = first + j;
        const int64_t lane = t % ld;
        const uint16_t* kt = k + (t / ld) * ld * d + i0 * ld + lane;
        float* sj = s + h0 * s_stride + j;
        int64_t r = ld - lane < 8 ? ld - lane : 8;
        if (n - j < r) r = n - j;
        auto strip = [&]<int G, int S, bool kFull>(int64_t g) {
          ScoresStrip<G, S, kFull>(kt, ld, r, qt + g, dims, scale, sj + g * s_stride, s_stride,
                                   add, ahead);
        };
        if (ld - lane >= 16 && n - j >= 16) {
          ByHeadGroups<4>(heads,
                          [&]<int G>(int64_t g) { strip.template operator()<G, 2, true>(g); });
          j += 16;
        } else if (r == 8) {
          ByHeadGroups(heads, [&]<int G>(int64_t g) { strip.template operator()<G, 1, true>(g); });
          j += 8;
        } else {
          ByHeadGroups(heads, [&]<int G>(int64_t g) { strip.template operator()<G, 1, false>(g); });
          j += r;
        }
      }
    }
  }
  ahead.Return(prefetch);
}

// G query heads against 8 * S slots of a Q8_0 K stored dimension-major (S = 2: 16 slots; S = 1:
// r <= 8, a last strip of r < 8 through zeroed copies), in integers, four dimensions at a
// time: the slots' codes of dimensions i .. i + 3 are gathered into one int32 lane a slot
// (once for all G heads) and meet a broadcast quad of the query's codes as maddubs(|k|,
// sign(q, k)): pairs of at most 2 * 128 * 127 < 32768 (exact for a code of -128 too, as the
// query's codes stay within +-127), and madd by ones sums each lane's two pairs. The group's
// exact sum then goes times the query's and the slots' scales into s. Pairs of dimensions
// widened to 16 bits for vpmaddwd (one per 16 products, with the widening and interleaving)
// took longer than f16's FMAs (BM_AttentionKernels); this takes one vpmaddwd per 32 products.
template <int G, int S>
void ScoresQ8Strip(const uint8_t* k, const Q8DimsLayout& lay, int64_t j, int64_t r,
                   const BlockQ8Act* q, int64_t d, float scale, float* s, int64_t s_stride,
                   Ahead& ahead) {
  const int64_t groups = d / kQK;
  auto row = [&](const uint8_t* c) {
    if (S == 2) return _mm_loadu_si128(reinterpret_cast<const __m128i*>(c));
    if (r == 8) return _mm_loadl_epi64(reinterpret_cast<const __m128i*>(c));
    int64_t bytes = 0;
    std::memcpy(&bytes, c, static_cast<size_t>(r));
    return _mm_cvtsi64_si128(bytes);
  };
  const __m256i ones = _mm256_set1_epi16(1);
  for (int64_t b = 0; b < groups; ++b) {
    // The heads' codes side by side, so that one pointer reaches every quad (G pointers into
    // q held more general registers than there are).
    alignas(32) int8_t qc[G][kQK];
    for (int g = 0; g < G; ++g) std::memcpy(qc[g], q[g * groups + b].qs, kQK);
    __m256i dot[S][G];
    for (int v = 0; v < S; ++v) {
      for (int g = 0; g < G; ++g) dot[v][g] = _mm256_setzero_si256();
    }
    for (int64_t i = 0; i < kQK; i += 4) {
      ahead.Step();
      const uint8_t* c = k + lay.CodeOffset(b, i, j);
      const __m128i d0 = row(c), d1 = row(c + lay.slots);
      const __m128i d2 = row(c + 2 * lay.slots), d3 = row(c + 3 * lay.slots);
      // Byte 4s + e of quads[v] is slot 8v + s's code of dimension i + e.
      __m256i quads[S];
      const __m128i lo01 = _mm_unpacklo_epi8(d0, d1), lo23 = _mm_unpacklo_epi8(d2, d3);
      quads[0] = _mm256_set_m128i(_mm_unpackhi_epi16(lo01, lo23), _mm_unpacklo_epi16(lo01, lo23));
      if constexpr (S == 2) {
        const __m128i hi01 = _mm_unpackhi_epi8(d0, d1), hi23 = _mm_unpackhi_epi8(d2, d3);
        quads[1] =
            _mm256_set_m128i(_mm_unpackhi_epi16(hi01, hi23), _mm_unpacklo_epi16(hi01, hi23));
      }
      __m256i magnitudes[S];
      for (int v = 0; v < S; ++v) magnitudes[v] = _mm256_abs_epi8(quads[v]);
      for (int g = 0; g < G; ++g) {
        int32_t four;
        std::memcpy(&four, qc[g] + i, sizeof four);
        const __m256i qq = _mm256_set1_epi32(four);
        for (int v = 0; v < S; ++v) {
          const __m256i pairs =
              _mm256_maddubs_epi16(magnitudes[v], _mm256_sign_epi8(qq, quads[v]));
          dot[v][g] = _mm256_add_epi32(dot[v][g], _mm256_madd_epi16(pairs, ones));
          InRegister(dot[v][g]);  // in order, so that the 8 sums stay in registers
        }
      }
    }
    for (int v = 0; v < S; ++v) {
      const auto* sc = reinterpret_cast<const uint16_t*>(k + lay.ScaleOffset(b, j + 8 * v));
      const __m256 scales = S == 2 || r == 8 ? F16Src::Load(sc) : LoadTail<F16Src>(sc, r);
      __m256 part[G];
      for (int g = 0; g < G; ++g) {
        const __m256 w = _mm256_mul_ps(scales, _mm256_set1_ps(q[g * groups + b].d));
        part[g] = _mm256_mul_ps(_mm256_cvtepi32_ps(dot[v][g]), w);
      }
      // Each group's scores add into s: float accumulators kept across the groups as well
      // spilled an integer one to the stack, a store and a load on its chain.
      StoreScores<G>(part, S == 2 ? 8 : r, scale, s + 8 * v, s_stride, b > 0);
    }
  }
}

// Strips of 16 slots, 4 heads at a time, then of up to 8 slots and 8 heads.
void ScoresQ8T(const uint8_t* k, int64_t ld, int64_t first, int64_t n, const BlockQ8Act* q,
               int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
               Prefetch* prefetch) {
  const Q8DimsLayout lay{ld};
  Ahead ahead(prefetch);
  for (int64_t j = 0; j < n;) {
    const int64_t r = n - j < 8 ? n - j : 8;
    auto strip = [&]<int G, int S>(int64_t g) {
      ScoresQ8Strip<G, S>(k, lay, first + j, r, q + g * (d / kQK), d, scale,
                          s + g * s_stride + j, s_stride, ahead);
    };
    if (n - j >= 16) {
      ByHeadGroups<4>(n_g, [&]<int G>(int64_t g) { strip.template operator()<G, 2>(g); });
      j += 16;
    } else {
      ByHeadGroups(n_g, [&]<int G>(int64_t g) { strip.template operator()<G, 1>(g); });
      j += r;
    }
  }
  ahead.Return(prefetch);
}

// The same arithmetic as the reference, lane by lane: |x| and max are exact, d and 1/d are the
// same scalar operations, x * id is one rounding and _mm256_round_ps rounds ties to even as
// nearbyint does, so the bits agree.
void QuantizeAct(const float* x, BlockQ8Act* xq, int64_t n) {
  const __m256 sign_bit = _mm256_set1_ps(-0.0f);
  // packs_epi32 then packs_epi16 leave 4-byte groups in the order 0 2 4 6 1 3 5 7.
  const __m256i order = _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7);
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      amax = _mm256_max_ps(amax, _mm256_andnot_ps(sign_bit, v[k]));
    }
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    m = _mm_max_ss(m, _mm_movehdup_ps(m));
    const float d = _mm_cvtss_f32(m) / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    xq[b].d = d;
    const __m256 vid = _mm256_set1_ps(id);
    __m256i q[4];
    for (int k = 0; k < 4; ++k) {
      q[k] = _mm256_cvtps_epi32(_mm256_round_ps(_mm256_mul_ps(v[k], vid),
                                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
    }
    const __m256i q_sum =
        _mm256_add_epi32(_mm256_add_epi32(q[0], q[1]), _mm256_add_epi32(q[2], q[3]));
    __m128i isum = _mm_add_epi32(_mm256_castsi256_si128(q_sum), _mm256_extracti128_si256(q_sum, 1));
    isum = _mm_add_epi32(isum, _mm_shuffle_epi32(isum, 0x4e));
    isum = _mm_add_epi32(isum, _mm_shuffle_epi32(isum, 0xb1));
    xq[b].sum = d * static_cast<float>(_mm_cvtsi128_si32(isum));
    const __m256i q16 = _mm256_packs_epi16(_mm256_packs_epi32(q[0], q[1]),
                                           _mm256_packs_epi32(q[2], q[3]));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(xq[b].qs),
                        _mm256_permutevar8x32_epi32(q16, order));
  }
}

// How ActTile reads one kind of weight block as 32 integers for maddubs, which multiplies
// unsigned by signed bytes:
//   Q8_0  signed q: its signs move onto x (|q| <= 128 and |x| <= 127 keep a pair sum below the
//         int16 limit)
//   Q4_0  the nibbles n = q + 8, already unsigned; sum_j n_j x_j - 8 sum_j x_j is the dot, and
//         the activation block carries sum_j x_j (BlockQ8Act::sum)
struct Q8_0Ints {
  using Block = BlockQ8_0;
  static constexpr float kOffset = 0.0f;
  static __m256i Load(const BlockQ8_0& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
  static __m256i Pairs(__m256i w, __m256i x) {
    return _mm256_maddubs_epi16(_mm256_sign_epi8(w, w), _mm256_sign_epi8(x, w));
  }
};

struct Q4_0Ints {
  using Block = BlockQ4_0;
  static constexpr float kOffset = 8.0f;
  static __m256i Load(const BlockQ4_0& b) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    // Byte j holds element j in its low nibble and element j + 16 in its high nibble.
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(packed, 4), low_nibble),
                            _mm_and_si128(packed, low_nibble));
  }
  static __m256i Pairs(__m256i w, __m256i x) { return _mm256_maddubs_epi16(w, x); }
};

// How far ahead of the block in use ActTile asks for weight rows. Decode streams every weight
// once and the loop does too much work per byte for the hardware prefetcher to keep enough
// reads in flight; asking 4 KiB ahead (a row or two of a 2,048-wide matrix) raised TinyLlama
// tg with Q8_0 and Q4_0 weights by about 20% on the 2-core Zen 1 here (alternated runs; 2 and
// 8 KiB did no better).
constexpr int kPrefetchBytes = 4096;

// a * b + c with one rounding. Spelled out so that the compiler's choice to contract (or not)
// cannot differ between two tile shapes and break their bit-for-bit agreement.
float FmaScalar(float a, float b, float c) {
  return _mm_cvtss_f32(_mm_fmadd_ss(_mm_set_ss(a), _mm_set_ss(b), _mm_set_ss(c)));
}

// R weight rows x T tokens of quantized activations, every (row, token) with the same
// operations in the same order whatever R and T are: blocks alternate between two
// accumulators (so consecutive FMAs do not wait on each other), which are added at the end.
// One block's term is
//   acc += f32(sum_j w[j] * x[j]) * (d_w * d_x),   offset += d_w * sum_x
// and the result is HSum(acc) - kOffset * offset. Each loaded weight block serves T tokens
// and each activation block R rows.
template <class Ints, int R, int T>
void ActTile(const typename Ints::Block* const rows[R], const BlockQ8Act* const xq[T], int64_t n,
             float* y, int64_t y_stride) {
  const __m256i ones = _mm256_set1_epi16(1);
  float offset[R][T] = {};
  auto step = [&](int64_t i, __m256 (&acc)[R][T]) {
    __m256i x[T];
    for (int t = 0; t < T; ++t) {
      x[t] = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[t][i].qs));
    }
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(&rows[r][i]) + kPrefetchBytes, _MM_HINT_T0);
      const __m256i w = Ints::Load(rows[r][i]);
      const float dw = Scale(rows[r][i].d);
      for (int t = 0; t < T; ++t) {
        const __m256 sum = _mm256_cvtepi32_ps(_mm256_madd_epi16(Ints::Pairs(w, x[t]), ones));
        acc[r][t] = _mm256_fmadd_ps(sum, _mm256_set1_ps(dw * xq[t][i].d), acc[r][t]);
        if constexpr (Ints::kOffset != 0.0f) {
          offset[r][t] = FmaScalar(dw, xq[t][i].sum, offset[r][t]);
        }
      }
    }
  };
  __m256 acc0[R][T];
  __m256 acc1[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc0[r][t] = acc1[r][t] = _mm256_setzero_ps();
  }
  const int64_t nb = n / kQK;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    step(i, acc0);
    step(i + 1, acc1);
  }
  if (i < nb) step(i, acc0);
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      y[t * y_stride + r] =
          FmaScalar(-Ints::kOffset, offset[r][t], HSum(_mm256_add_ps(acc0[r][t], acc1[r][t])));
    }
  }
}

template <class Ints>
float DotActBlocks(const void* row, const BlockQ8Act* xq, int64_t n) {
  const typename Ints::Block* rows[1] = {static_cast<const typename Ints::Block*>(row)};
  const BlockQ8Act* xqs[1] = {xq};
  float y;
  ActTile<Ints, 1, 1>(rows, xqs, n, &y, 1);
  return y;
}

// Rows in pairs, tokens in pairs: 2 x 2 x 2 accumulators fit the 16 ymm registers with the
// loaded blocks.
template <class Ints, int R>
void ActTileRows(const ActTileArgs& a, int64_t r0) {
  const typename Ints::Block* rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = reinterpret_cast<const typename Ints::Block*>(a.w + (r0 + r) * a.row_bytes);
  }
  int64_t t = 0;
  for (; t + 2 <= a.n_tok; t += 2) {
    const BlockQ8Act* xq[2] = {a.xq + t * a.xq_stride, a.xq + (t + 1) * a.xq_stride};
    ActTile<Ints, R, 2>(rows, xq, a.n, a.y + t * a.y_stride + r0, a.y_stride);
  }
  if (t < a.n_tok) {
    const BlockQ8Act* xq[1] = {a.xq + t * a.xq_stride};
    ActTile<Ints, R, 1>(rows, xq, a.n, a.y + t * a.y_stride + r0, a.y_stride);
  }
}

// R float-type rows against one x, for decode, as kernels_avx512.cc's RowsTile: R sums in
// flight, each x vector loaded once for all R, and each 64-byte line asks the L2 for the same
// line of the next tile's rows.
template <class Src, int R>
void RowsTile(const RowsArgs& a, int64_t r0) {
  using Elem = typename Src::Elem;
  constexpr int64_t kLine = 64 / sizeof(Elem);  // elements in one 64-byte line
  static_assert(kLine % 8 == 0);
  const Elem* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const Elem*>(a.w + (r0 + r) * a.row_bytes);
  const int64_t next_tile = R * static_cast<int64_t>(a.row_bytes);
  __m256 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm256_setzero_ps();
  int64_t i = 0;
  for (; i + kLine <= a.n; i += kLine) {
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + i) + next_tile, _MM_HINT_T1);
    }
    for (int64_t j = i; j < i + kLine; j += 8) {
      const __m256 xv = _mm256_loadu_ps(a.x + j);
      for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(Src::Load(w[r] + j), xv, acc[r]);
    }
  }
  for (; i + 8 <= a.n; i += 8) {
    const __m256 xv = _mm256_loadu_ps(a.x + i);
    for (int r = 0; r < R; ++r) acc[r] = _mm256_fmadd_ps(Src::Load(w[r] + i), xv, acc[r]);
  }
  if (i < a.n) {
    float xt[8] = {};
    std::memcpy(xt, a.x + i, static_cast<size_t>(a.n - i) * sizeof(float));
    const __m256 xv = _mm256_loadu_ps(xt);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm256_fmadd_ps(LoadTail<Src>(w[r] + i, a.n - i), xv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) a.y[r0 + r] = HSum(acc[r]);
}

template <class Src>
void DotRowsOf(const RowsArgs& a) {
  int64_t r = 0;
  for (; r + 8 <= a.n_rows; r += 8) RowsTile<Src, 8>(a, r);
  for (; r < a.n_rows; ++r) {
    a.y[r] = DotFloat<Src>(reinterpret_cast<const typename Src::Elem*>(a.w + r * a.row_bytes),
                           a.x, a.n);
  }
}

void DotRows(const RowsArgs& a) {
  switch (a.wt) {
    case DType::kF32:
      return DotRowsOf<F32Src>(a);
    case DType::kF16:
      return DotRowsOf<F16Src>(a);
    case DType::kBF16:
      return DotRowsOf<BF16Src>(a);
    default:  // quantized rows go through dot_act_tile; this keeps the contract anyway
      for (int64_t r = 0; r < a.n_rows; ++r) a.y[r] = Dot(a.wt, a.w + r * a.row_bytes, a.x, a.n);
  }
}

template <class Ints>
void DotActTileBlocks(const ActTileArgs& a) {
  int r = 0;
  for (; r + 2 <= a.n_rows; r += 2) ActTileRows<Ints, 2>(a, r);
  if (r < a.n_rows) ActTileRows<Ints, 1>(a, r);
}

void DotActTile(const ActTileArgs& a) {
  if (a.wt == DType::kQ8_0) return DotActTileBlocks<Q8_0Ints>(a);
  DotActTileBlocks<Q4_0Ints>(a);
}

float DotAct(DType t, const void* row, const BlockQ8Act* xq, int64_t n) {
  if (t == DType::kQ8_0) return DotActBlocks<Q8_0Ints>(row, xq, n);
  return DotActBlocks<Q4_0Ints>(row, xq, n);
}

// Interleaved Q4_0 weights (BlockQ4_0x16), 8 of a group's 16 rows at a time (the half h):
// c[j] holds those rows' quads that meet the activations' quad j, one row per int32 lane.
// AVX2 has no vpdpbusd: maddubs multiplies unsigned by signed bytes into int16 pairs and
// madd by ones sums the pairs, which is the lane's exact 4-term dot.
struct Q4_0x8Codes {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0x16);
  static constexpr int64_t kAheadBytes = 1024;  // see Act16DecodeGroup
  // The nibbles of a block's qs, code + 8 (unsigned).
  static void Load(const uint8_t* qs, int h, __m256i c[8]) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    for (int j = 0; j < 4; ++j) {
      const auto* line = reinterpret_cast<const __m256i*>(qs + 64 * j + 32 * h);
      const __m256i v = _mm256_loadu_si256(line);
      c[j] = _mm256_and_si256(v, low);
      c[4 + j] = _mm256_and_si256(_mm256_srli_epi16(v, 4), low);
    }
  }
  // sum_j w_j x_j over the block for each lane's row. The int16 pairs (at most 2 * 15 * 127)
  // add up over the 8 quads without overflow (8 * 3810 < 32768) before one madd; the +8 of
  // each code comes off as 8 * the activations' code sum.
  static __m256i Dot(const __m256i c[8], const BlockQ8Act& x, int32_t xsum) {
    __m256i pairs = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      int32_t quad;
      std::memcpy(&quad, x.qs + 4 * j, sizeof(quad));
      pairs = _mm256_add_epi16(pairs, _mm256_maddubs_epi16(c[j], _mm256_set1_epi32(quad)));
    }
    return _mm256_sub_epi32(_mm256_madd_epi16(pairs, _mm256_set1_epi16(1)),
                            _mm256_set1_epi32(8 * xsum));
  }
  // Dot for both halves of a block at once (Act16DecodeGroup): each line's nibbles of both
  // kinds meet their quads as they are read.
  static void BothHalves(const uint8_t* qs, const BlockQ8Act& x, int32_t xsum, __m256i dot[2]) {
    const __m256i low = _mm256_set1_epi8(0x0f);
    __m256i pairs[2] = {_mm256_setzero_si256(), _mm256_setzero_si256()};
    for (int j = 0; j < 4; ++j) {
      int32_t lo_quad, hi_quad;
      std::memcpy(&lo_quad, x.qs + 4 * j, sizeof(lo_quad));
      std::memcpy(&hi_quad, x.qs + 16 + 4 * j, sizeof(hi_quad));
      const __m256i xl = _mm256_set1_epi32(lo_quad), xh = _mm256_set1_epi32(hi_quad);
      for (int h = 0; h < 2; ++h) {
        const __m256i v =
            _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qs + 64 * j + 32 * h));
        pairs[h] = _mm256_add_epi16(
            pairs[h], _mm256_add_epi16(
                          _mm256_maddubs_epi16(_mm256_and_si256(v, low), xl),
                          _mm256_maddubs_epi16(_mm256_and_si256(_mm256_srli_epi16(v, 4), low),
                                               xh)));
      }
      // The sums in this order: as trees they pushed acc of Act16DecodeGroup to the stack
      // (BM_DecodeResident one core 4-7% slower, docs/performance.md).
      for (__m256i& p : pairs) InRegister(p);
    }
    const __m256i offset = _mm256_set1_epi32(8 * xsum);
    for (int h = 0; h < 2; ++h) {
      dot[h] = _mm256_sub_epi32(_mm256_madd_epi16(pairs[h], _mm256_set1_epi16(1)), offset);
    }
  }
};

// Q8_0 codes are stored + 128, whose pairs with the activations would overflow maddubs'
// int16. Flipped back to signed, each weight quad meets the activation quad carrying the
// weights' signs, maddubs(|w|, sign(x, w)): pairs of at most 2 * 128 * 127 < 32768, exact for
// a code of -128 too (|-128| is 128 read unsigned), as the activations' codes stay within
// +-127 (QuantizeAct). One madd a quad widens the pairs, which could not add up in int16.
struct Q8_0x8Codes {
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0x16);
  static constexpr int64_t kAheadBytes = 512;  // see Act16DecodeGroup
  static __m256i Signed(const uint8_t* line) {
    return _mm256_xor_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(line)),
                            _mm256_set1_epi8(static_cast<char>(0x80)));
  }
  static void Load(const uint8_t* qs, int h, __m256i c[8]) {
    for (int j = 0; j < 8; ++j) c[j] = Signed(qs + 64 * j + 32 * h);
  }
  static __m256i QuadDot(__m256i w, __m256i x) {
    return _mm256_madd_epi16(_mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w)),
                             _mm256_set1_epi16(1));
  }
  static __m256i Dot(const __m256i c[8], const BlockQ8Act& x, int32_t /*xsum*/) {
    __m256i dot = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      int32_t quad;
      std::memcpy(&quad, x.qs + 4 * j, sizeof(quad));
      dot = _mm256_add_epi32(dot, QuadDot(c[j], _mm256_set1_epi32(quad)));
    }
    return dot;
  }
  // Dot for both halves of a block at once (Act16DecodeGroup), line by line.
  static void BothHalves(const uint8_t* qs, const BlockQ8Act& x, int32_t /*xsum*/,
                         __m256i dot[2]) {
    dot[0] = dot[1] = _mm256_setzero_si256();
    for (int j = 0; j < 8; ++j) {
      int32_t quad;
      std::memcpy(&quad, x.qs + 4 * j, sizeof(quad));
      const __m256i xj = _mm256_set1_epi32(quad);
      for (int h = 0; h < 2; ++h) {
        dot[h] = _mm256_add_epi32(dot[h], QuadDot(Signed(qs + 64 * j + 32 * h), xj));
      }
      for (int h = 0; h < 2; ++h) InRegister(dot[h]);  // as in Q4_0x8Codes::BothHalves
    }
  }
};

// Half h of group g against T tokens from t0: each block's codes are unpacked once for the T
// tokens; acc = fma(f32(dot) * d_w, d_x, acc) block by block, as the contract orders it.
template <class Codes, int T>
void Act8Half(const Act16Args& a, int64_t g, int h, int64_t t0) {
  const int64_t nb = a.n / kQK;
  const Interleaved16Layout layout{nb, Codes::kBlockBytes};
  const uint8_t* group = a.w + g * layout.GroupBytes();
  __m256 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm256_setzero_ps();
  for (int64_t b = 0; b < nb; ++b) {
    __m256i c[8];
    Codes::Load(group + layout.QsOffset(b), h, c);
    const __m256 dw = _mm256_cvtph_ps(_mm_loadu_si128(
        reinterpret_cast<const __m128i*>(group + layout.ScaleOffset(b) + 16 * h)));
    for (int t = 0; t < T; ++t) {
      const int64_t at = (t0 + t) * a.xq_stride + b;
      const BlockQ8Act& x = a.xq[at];
      const __m256 s = _mm256_mul_ps(_mm256_cvtepi32_ps(Codes::Dot(c, x, a.xsum[at])), dw);
      acc[t] = _mm256_fmadd_ps(s, _mm256_set1_ps(x.d), acc[t]);
    }
  }
  for (int t = 0; t < T; ++t) {
    _mm256_storeu_ps(a.y + (t0 + t) * a.y_stride + 16 * g + 8 * h, acc[t]);
  }
}

// Group g of interleaved weights against one token (decode): both halves at once, so that
// each 64-byte line of codes is read once, in order, and each activation quad is broadcast
// once for the 16 rows. The same arithmetic as Act8Half<Codes, 1>.
// The weights are asked for Codes::kAheadBytes ahead of the block in use. Without the
// request, the hardware prefetchers alone kept 2 threads' decode stream at 0.77-0.80 of the
// read loop's bandwidth on the 2-core Zen 3 here. Q4_0, 1 KiB ahead: 0.87-0.93, 2 KiB
// 0.82-0.93, 4 KiB 0.78-0.89 (`BM_DecodeStream/dtype:2`, 5 repetitions each, two rounds).
// Q8_0 does best about one of its 544-byte blocks ahead: 512 bytes 0.83-0.92, 1 KiB 0.80-0.89
// (`BM_DecodeStream/dtype:8/rows:2048`, alternated, docs/performance.md).
template <class Codes>
void Act16DecodeGroup(const Act16Args& a, int64_t g, int64_t t) {
  // Requests that cover a block's bytes: 5 for Q4_0's 288, 9 for Q8_0's 544.
  constexpr int kBlockLines = (Codes::kBlockBytes + 63) / 64;
  const int64_t nb = a.n / kQK;
  const Interleaved16Layout layout{nb, Codes::kBlockBytes};
  const uint8_t* group = a.w + g * layout.GroupBytes();
  const BlockQ8Act* xq = a.xq + t * a.xq_stride;
  const int32_t* xsum = a.xsum + t * a.xq_stride;
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  for (int64_t b = 0; b < nb; ++b) {
    const char* ahead = reinterpret_cast<const char*>(group + b * layout.block_bytes);
    for (int l = 0; l < kBlockLines; ++l) {
      _mm_prefetch(ahead + Codes::kAheadBytes + 64 * l, _MM_HINT_T0);
    }
    __m256i dot[2];
    Codes::BothHalves(group + layout.QsOffset(b), xq[b], xsum[b], dot);
    const __m256 xd = _mm256_set1_ps(xq[b].d);
    const uint8_t* scales = group + layout.ScaleOffset(b);
    for (int h = 0; h < 2; ++h) {
      const __m256 dw = _mm256_cvtph_ps(
          _mm_loadu_si128(reinterpret_cast<const __m128i*>(scales + 16 * h)));
      acc[h] = _mm256_fmadd_ps(_mm256_mul_ps(_mm256_cvtepi32_ps(dot[h]), dw), xd, acc[h]);
    }
  }
  for (int h = 0; h < 2; ++h) _mm256_storeu_ps(a.y + t * a.y_stride + 16 * g + 8 * h, acc[h]);
}

// Decode one group after another through Act16DecodeGroup; prefill a half-group at a time,
// tokens 4 at a time (8 code vectors + 4 accumulators of the 16 ymm registers), then 2, 1.
template <class Codes>
void DotAct16Of(const Act16Args& a) {
  for (int64_t g = 0; g < a.n_groups; ++g) {
    if (a.n_tok == 1) {
      Act16DecodeGroup<Codes>(a, g, 0);
      continue;
    }
    for (int h = 0; h < 2; ++h) {
      int64_t t = 0;
      for (; t + 4 <= a.n_tok; t += 4) Act8Half<Codes, 4>(a, g, h, t);
      if (t + 2 <= a.n_tok) {
        Act8Half<Codes, 2>(a, g, h, t);
        t += 2;
      }
      if (t < a.n_tok) Act8Half<Codes, 1>(a, g, h, t);
    }
  }
}

void DotAct16(const Act16Args& a) {
  if (a.wt == DType::kQ8_0) return DotAct16Of<Q8_0x8Codes>(a);
  DotAct16Of<Q4_0x8Codes>(a);
}

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
      // Otherwise GCC folds the load into each of the T FMAs, loading w T times, and the loop
      // becomes load bound (measured ~18% slower on Zen).
      InRegister(wv);
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

// Floats interleaved 16 rows at a time: 16 sums of 8 lanes would take every register this
// level has, and PrefersInterleaved keeps F16 and BF16 matrices in rows here.
void DotRows16(const Rows16Args& a) { ScalarLevelKernels().dot_rows16(a); }
void Widen16(DType wt, const uint8_t* group, const FloatChunkOrder& order, int64_t first_chunk,
             int64_t n_chunks, float* out, int64_t out_stride) {
  ScalarLevelKernels().widen16(wt, group, order, first_chunk, n_chunks, out, out_stride);
}

}  // namespace

const LevelKernels& Avx2LevelKernels() {
  static constexpr LevelKernels kLevel = {
      {SimdLevel::kAvx2, &Dot, &Axpy, &Dequantize, &DotF32, &WeightedRows, &ExpSum,
       &MaxF32, &ScoresF16T, &ScoresQ8T, &QuantizeAct, &DotAct, &SwiGlu, &ToF16, 0},
      &DotTile,
      &DotRows,
      &DotActTile,
      &DotRows16,
      &Widen16,
      &DotAct16,
  };
  return kLevel;
}

}  // namespace kvllm::internal
