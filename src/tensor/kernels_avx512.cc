// AVX-512 kernels (F, BW, VL, DQ and VNNI, with FMA and F16C): 16 floats a vector, masked
// loads and stores for row tails, and VNNI's vpdpbusd (four u8 x s8 products summed into each
// int32 lane in one instruction) for the Q8_0 / Q4_0 dot with quantized activations. Like
// kernels_avx2.cc this file alone is compiled with those instruction sets, so it must not
// define anything with external or vague linkage that other files could pick up (no std
// templates, no inline functions from shared headers).
#include "tensor/avx512_intrinsics.h"

#include <cstdint>
#include <cstring>

#include "tensor/kernels_internal.h"
#include "tensor/quant.h"

namespace kvllm::internal {

namespace {

// The first r < 16 lanes.
__mmask16 TailMask(int64_t r) { return static_cast<__mmask16>((1u << r) - 1u); }

float HSum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

float HSum(__m512 v) {
  return HSum(_mm256_add_ps(_mm512_castps512_ps256(v),
                            _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1))));
}

// Loaders of 16 consecutive elements of a float-type row, widened to f32; LoadMasked reads
// only the lanes of `m` (no access past a row's end) and zeroes the others.
struct F32Src {
  using Elem = float;
  static __m512 Load(const float* p) { return _mm512_loadu_ps(p); }
  static __m512 LoadMasked(__mmask16 m, const float* p) { return _mm512_maskz_loadu_ps(m, p); }
};

struct F16Src {
  using Elem = uint16_t;
  static __m512 Load(const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 LoadMasked(__mmask16 m, const uint16_t* p) {
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, p));
  }
};

struct BF16Src {
  using Elem = uint16_t;
  // bf16 is the top half of an f32.
  static __m512 Widen(__m256i v) {
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(v), 16));
  }
  static __m512 Load(const uint16_t* p) {
    return Widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static __m512 LoadMasked(__mmask16 m, const uint16_t* p) {
    return Widen(_mm256_maskz_loadu_epi16(m, p));
  }
};

// How far ahead of the elements in use DotFloat asks for the row: decode runs it over
// consecutive rows of a matrix, so this reaches into the next rows.
constexpr int64_t kDotPrefetchBytes = 4096;

template <class Src>
float DotFloat(const typename Src::Elem* a, const float* x, int64_t n) {
  // Four accumulators keep four FMA chains in flight to cover the FMA latency.
  __m512 acc0 = _mm512_setzero_ps();
  __m512 acc1 = _mm512_setzero_ps();
  __m512 acc2 = _mm512_setzero_ps();
  __m512 acc3 = _mm512_setzero_ps();
  // A first, masked step up to the row's next vector-aligned address: a 64-byte load that
  // straddles two cache lines costs two, and float rows are often only 16-byte aligned.
  constexpr uintptr_t kVecBytes = 16 * sizeof(typename Src::Elem);
  const auto misalign = static_cast<int64_t>(
      ((kVecBytes - reinterpret_cast<uintptr_t>(a) % kVecBytes) % kVecBytes) /
      sizeof(typename Src::Elem));
  int64_t i = misalign < n ? misalign : n;
  if (i > 0) {
    const __mmask16 m = TailMask(i);
    acc2 = _mm512_fmadd_ps(Src::LoadMasked(m, a), _mm512_maskz_loadu_ps(m, x), acc2);
  }
  for (; i + 64 <= n; i += 64) {
    const char* ahead = reinterpret_cast<const char*>(a + i) + kDotPrefetchBytes;
    for (size_t b = 0; b < 64 * sizeof(typename Src::Elem); b += 64) {
      _mm_prefetch(ahead + b, _MM_HINT_T0);
    }
    acc0 = _mm512_fmadd_ps(Src::Load(a + i), _mm512_loadu_ps(x + i), acc0);
    acc1 = _mm512_fmadd_ps(Src::Load(a + i + 16), _mm512_loadu_ps(x + i + 16), acc1);
    acc2 = _mm512_fmadd_ps(Src::Load(a + i + 32), _mm512_loadu_ps(x + i + 32), acc2);
    acc3 = _mm512_fmadd_ps(Src::Load(a + i + 48), _mm512_loadu_ps(x + i + 48), acc3);
  }
  for (; i + 16 <= n; i += 16) {
    acc0 = _mm512_fmadd_ps(Src::Load(a + i), _mm512_loadu_ps(x + i), acc0);
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    acc1 = _mm512_fmadd_ps(Src::LoadMasked(m, a + i), _mm512_maskz_loadu_ps(m, x + i), acc1);
  }
  return HSum(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

template <class Src>
void AxpyFloat(const typename Src::Elem* a, float alpha, float* y, int64_t n) {
  const __m512 va = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    _mm512_storeu_ps(y + i, _mm512_fmadd_ps(Src::Load(a + i), va, _mm512_loadu_ps(y + i)));
  }
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(
        y + i, m, _mm512_fmadd_ps(Src::LoadMasked(m, a + i), va, _mm512_maskz_loadu_ps(m, y + i)));
  }
}

template <class Src>
void DequantizeFloat(const typename Src::Elem* a, float* y, int64_t n) {
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, Src::Load(a + i));
  if (i < n) {
    const __mmask16 m = TailMask(n - i);
    _mm512_mask_storeu_ps(y + i, m, Src::LoadMasked(m, a + i));
  }
}

// The 16 bytes at p sign-extended to f32 lanes.
__m512 I8ToF32(__m128i v) { return _mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(v)); }

// Unpackers of one block's 32 quants into 2 vectors of 16 unscaled f32 values, elements in
// order, so callers only multiply by the block scale d.
struct Q8_0Src {
  using Block = BlockQ8_0;
  static void Unpack(const BlockQ8_0& b, __m512 q[2]) {
    q[0] = I8ToF32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)));
    q[1] = I8ToF32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs + 16)));
  }
};

struct Q4_0Src {
  using Block = BlockQ4_0;
  static void Unpack(const BlockQ4_0& b, __m512 q[2]) {
    const __m128i packed = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs));
    const __m128i low_nibble = _mm_set1_epi8(0x0f);
    const __m128i eight = _mm_set1_epi8(8);
    // Byte j holds element j in its low nibble and element j + 16 in its high nibble.
    q[0] = I8ToF32(_mm_sub_epi8(_mm_and_si128(packed, low_nibble), eight));
    q[1] = I8ToF32(_mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(packed, 4), low_nibble), eight));
  }
};

float Scale(uint16_t d) { return _cvtsh_ss(d); }

template <class Src>
float DotBlocks(const void* row, const float* x, int64_t n) {
  const auto* b = static_cast<const typename Src::Block*>(row);
  // Two accumulators so consecutive blocks' FMAs do not wait on each other.
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    __m512 q[2];
    Src::Unpack(b[ib], q);
    const float* xb = x + ib * kQK;
    const __m512 s = _mm512_fmadd_ps(q[1], _mm512_loadu_ps(xb + 16),
                                     _mm512_mul_ps(q[0], _mm512_loadu_ps(xb)));
    acc[ib & 1] = _mm512_fmadd_ps(s, _mm512_set1_ps(Scale(b[ib].d)), acc[ib & 1]);
  }
  return HSum(_mm512_add_ps(acc[0], acc[1]));
}

template <class Src>
void AxpyBlocks(const void* row, float a, float* y, int64_t n) {
  const auto* b = static_cast<const typename Src::Block*>(row);
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    __m512 q[2];
    Src::Unpack(b[ib], q);
    const __m512 scale = _mm512_set1_ps(a * Scale(b[ib].d));
    float* yb = y + ib * kQK;
    for (int k = 0; k < 2; ++k) {
      _mm512_storeu_ps(yb + 16 * k, _mm512_fmadd_ps(q[k], scale, _mm512_loadu_ps(yb + 16 * k)));
    }
  }
}

template <class Src>
void DequantizeBlocks(const void* row, float* y, int64_t n) {
  const auto* b = static_cast<const typename Src::Block*>(row);
  for (int64_t ib = 0; ib < n / kQK; ++ib) {
    __m512 q[2];
    Src::Unpack(b[ib], q);
    const __m512 d = _mm512_set1_ps(Scale(b[ib].d));
    for (int k = 0; k < 2; ++k) _mm512_storeu_ps(y + ib * kQK + 16 * k, _mm512_mul_ps(q[k], d));
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

// Attention's kernels here ask for a line per 64 bytes they read (one per dimension of a pair
// of K strips, one per 64 bytes of a V row in a pass's strips), so they are given their own
// data this far ahead (KernelSet::prefetch_lead): two 2 KiB K tiles, 32 rows of an f16 V
// (2 and 8 KiB measured alike).
constexpr int64_t kPrefetchLead = 4096;

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
      if (far > 0) _mm_prefetch(reinterpret_cast<const char*>(next + far), _MM_HINT_T1);
      next += 64;
    }
  }
  void Return(Prefetch* p) const {
    if (p) p->next = next;
  }
};

// G heads' y over C vectors of 16 columns stay in registers while every row of v adds into them:
// each v vector loaded (and widened from Src's type) serves G FMAs, and G * C independent
// chains cover the FMA latency. With kMasked only the first `m` lanes of the single vector
// (C == 1) are touched.
template <class Src, int G, int C, bool kMasked>
void WeightedStrip(const float* p, int64_t p_stride, const typename Src::Elem* v, int64_t n,
                   int64_t d, __mmask16 m, float* y, Ahead& ahead) {
  __m512 acc[G][C];
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      acc[g][c] =
          kMasked ? _mm512_maskz_loadu_ps(m, y + g * d) : _mm512_loadu_ps(y + g * d + 16 * c);
    }
  }
  // 16-bit rows, given their own chunk ahead (prefetch_lead): a line per 64 bytes this strip
  // reads of a row. f32 rows (a q4_0 or KIVI V turned into floats in scratch, or an f32
  // cache) are given the next chunk, and keep a line a row, as before: four a row would ask
  // for it in a burst at the start of the chunk.
  constexpr int kSteps = sizeof(typename Src::Elem) == 2 ? (32 * C + 63) / 64 : 1;
  for (int64_t j = 0; j < n; ++j) {
    for (int t = 0; t < kSteps; ++t) ahead.Step();
    __m512 vj[C];
    for (int c = 0; c < C; ++c) {
      vj[c] = kMasked ? Src::LoadMasked(m, v + j * d) : Src::Load(v + j * d + 16 * c);
    }
    for (int g = 0; g < G; ++g) {
      const __m512 pj = _mm512_set1_ps(p[g * p_stride + j]);
      for (int c = 0; c < C; ++c) acc[g][c] = _mm512_fmadd_ps(pj, vj[c], acc[g][c]);
    }
  }
  for (int g = 0; g < G; ++g) {
    for (int c = 0; c < C; ++c) {
      if (kMasked) {
        _mm512_mask_storeu_ps(y + g * d, m, acc[g][c]);
      } else {
        _mm512_storeu_ps(y + g * d + 16 * c, acc[g][c]);
      }
    }
  }
}

// Strips of 64 columns, then of 16 (the last one masked), for up to 4 heads at a time; more
// heads go 4 at a time, each pass reading the rows again from L1. One pass of 8 heads over
// strips of 32 or of 16 columns (half the f16 conversions) measured no faster
// (kernels_bench BM_Attention/kv:0, 2026-12-03).
template <class Src, int G>
void WeightedHeads(const float* p, int64_t p_stride, const typename Src::Elem* v, int64_t n,
                   int64_t d, float* y, Ahead& ahead) {
  if constexpr (G > 4) {
    WeightedHeads<Src, 4>(p, p_stride, v, n, d, y, ahead);
    WeightedHeads<Src, G - 4>(p + 4 * p_stride, p_stride, v, n, d, y + 4 * d, ahead);
    return;
  }
  constexpr int C = 4;
  int64_t i = 0;
  for (; i + 16 * C <= d; i += 16 * C) {
    WeightedStrip<Src, G, C, false>(p, p_stride, v + i, n, d, 0, y + i, ahead);
  }
  for (; i + 16 <= d; i += 16) {
    WeightedStrip<Src, G, 1, false>(p, p_stride, v + i, n, d, 0, y + i, ahead);
  }
  if (i < d) {
    WeightedStrip<Src, G, 1, true>(p, p_stride, v + i, n, d, TailMask(d - i), y + i, ahead);
  }
}

template <class Src>
void WeightedRowsOf(const float* p, int64_t p_stride, int64_t n_g, const void* v_bytes,
                    int64_t n, int64_t d, float* y, Prefetch* prefetch) {
  const auto* v = static_cast<const typename Src::Elem*>(v_bytes);
  Ahead ahead(prefetch);
  ByHeadGroups(n_g, [&]<int G>(int64_t g) {
    WeightedHeads<Src, G>(p + g * p_stride, p_stride, v, n, d, y + g * d, ahead);
  });
  ahead.Return(prefetch);
}

// One head's weights for one block column of a run of Q8_0 V rows (kernels.h): w[j] =
// round(p[j] * dw[j]), dw[j] = d_j * (32767 / D), and w[len] = 0 (the partner of an odd last
// row).
void Q8VWeights(const float* p, const float* dw, int64_t len, int16_t* w) {
  for (int64_t j = 0; j < len; j += 16) {
    const __mmask16 k = TailMask(len - j < 16 ? len - j : 16);
    const __m512 t = _mm512_mul_ps(_mm512_maskz_loadu_ps(k, p + j), _mm512_loadu_ps(dw + j));
    // |t| <= 32767 * (1 + 2^-23): the rounded weight fits 16 bits.
    _mm256_mask_storeu_epi16(w + j, k, _mm512_cvtsepi32_epi16(_mm512_cvtps_epi32(t)));
  }
  w[len] = 0;
}

// acc += the pairwise 16-bit products of a and b, as _mm512_dpwssd_epi32, but in acc's own
// register: for the intrinsic GCC 12 copied each accumulator to another register and back
// at every step (16 moves and 2 spills a pair of rows for 8 heads).
void DpwssdInPlace(__m512i& acc, __m512i a, __m512i b) {
  __asm__("vpdpwssd %2, %1, %0" : "+v"(acc) : "v"(a), "v"(b));
}

// G heads' 32 output columns of one Q8_0 block column of V over a run of len rows, in
// integers: rows j and j + 1 widened to 16 bits and interleaved, so that one vpdpwssd adds
// w[j] * code_j + w[j + 1] * code_j+1 into each of 16 int32 lanes (32 products, where an FMA
// does 16). The interleave leaves lanes in the column order {0-3, 8-11, ...} and
// {4-7, 12-15, ...}, put back in order once at the end.
template <int G>
void Q8VStrip(const int16_t (*w)[kQ8VRunRows + 2], float unscale, const uint8_t* v,
              int64_t row_bytes, int64_t len, int64_t d, float* y, Ahead& ahead) {
  __m512i acc[G][2];
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = _mm512_setzero_si512();
  auto codes = [&](int64_t j) {
    const auto& block = *reinterpret_cast<const BlockQ8_0*>(v + j * row_bytes);
    return _mm512_cvtepi8_epi16(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(block.qs)));
  };
  // The last row of an odd run pairs with zero codes (its partner weight w[len] is 0 too).
  for (int64_t j = 0; j < len; j += 2) {
    ahead.Step();
    ahead.Step();
    const __m512i a = codes(j);
    const __m512i b = j + 1 < len ? codes(j + 1) : _mm512_setzero_si512();
    const __m512i lo = _mm512_unpacklo_epi16(a, b);
    const __m512i hi = _mm512_unpackhi_epi16(a, b);
#pragma GCC unroll 8
    for (int g = 0; g < G; ++g) {
      int32_t pair;
      std::memcpy(&pair, w[g] + j, sizeof(pair));
      const __m512i wp = _mm512_set1_epi32(pair);
      DpwssdInPlace(acc[g][0], lo, wp);
      DpwssdInPlace(acc[g][1], hi, wp);
    }
  }
  const __m512i first = _mm512_setr_epi32(0, 1, 2, 3, 16, 17, 18, 19, 4, 5, 6, 7, 20, 21, 22, 23);
  const __m512i second =
      _mm512_setr_epi32(8, 9, 10, 11, 24, 25, 26, 27, 12, 13, 14, 15, 28, 29, 30, 31);
  const __m512 u = _mm512_set1_ps(unscale);
  for (int g = 0; g < G; ++g) {
    float* out = y + g * d;
    const __m512i s0 = _mm512_permutex2var_epi32(acc[g][0], first, acc[g][1]);
    const __m512i s1 = _mm512_permutex2var_epi32(acc[g][0], second, acc[g][1]);
    _mm512_storeu_ps(out, _mm512_fmadd_ps(_mm512_cvtepi32_ps(s0), u, _mm512_loadu_ps(out)));
    _mm512_storeu_ps(out + 16,
                     _mm512_fmadd_ps(_mm512_cvtepi32_ps(s1), u, _mm512_loadu_ps(out + 16)));
  }
}

void WeightedRowsQ8(const float* p, int64_t p_stride, int64_t n_g, const void* v, int64_t n,
                    int64_t d, float* y, Prefetch* prefetch) {
  const auto* rows = static_cast<const uint8_t*>(v);
  const int64_t row_bytes = static_cast<int64_t>(RowBytes(DType::kQ8_0, d));
  Ahead ahead(prefetch);
  alignas(64) uint16_t dh[kQ8VRunRows];
  alignas(64) float dw[kQ8VRunRows];
  alignas(64) int16_t w[8][kQ8VRunRows + 2];
  for (int64_t r0 = 0; r0 < n; r0 += kQ8VRunRows) {
    const int64_t len = n - r0 < kQ8VRunRows ? n - r0 : kQ8VRunRows;
    const uint8_t* run = rows + r0 * row_bytes;
    for (int64_t b = 0; b < d / kQK; ++b) {
      const uint8_t* col = run + b * static_cast<int64_t>(sizeof(BlockQ8_0));
      // The rows' f16 scales side by side, then widened 16 at a time.
      for (int64_t j = 0; j < len; ++j) {
        dh[j] = reinterpret_cast<const BlockQ8_0*>(col + j * row_bytes)->d;
      }
      __m512 mv = _mm512_setzero_ps();
      for (int64_t j = 0; j < len; j += 16) {
        const __mmask16 k = TailMask(len - j < 16 ? len - j : 16);
        const __m512 dj = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(k, dh + j));
        _mm512_storeu_ps(dw + j, dj);
        mv = _mm512_max_ps(mv, _mm512_abs_ps(dj));
      }
      const float dmax = _mm512_reduce_max_ps(mv);
      if (dmax == 0.0f) continue;  // every weight is 0: y stays
      const __m512 to_int = _mm512_set1_ps(32767.0f / dmax);
      for (int64_t j = 0; j < len; j += 16) {
        _mm512_storeu_ps(dw + j, _mm512_mul_ps(_mm512_loadu_ps(dw + j), to_int));
      }
      ByHeadGroups(n_g, [&]<int G>(int64_t g0) {
        for (int g = 0; g < G; ++g) Q8VWeights(p + (g0 + g) * p_stride + r0, dw, len, w[g]);
        Q8VStrip<G>(w, dmax / 32767.0f, col, row_bytes, len, d, y + g0 * d + b * kQK, ahead);
      });
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

// exp(x) as in kernels_avx2.cc, 16 lanes at a time: 2^k * e^r with k = round(x / ln 2), r =
// x - k ln 2 (ln 2 in two parts so that k ln 2 is exact), e^r = 1 + r + r^2 p(r) with the
// degree-5 minimax p of the Cephes library's expf. vscalefps applies 2^k with the IEEE
// rounding of a multiply, going to 0 or infinity where the result leaves the float range, so
// no clamp of x is needed.
__m512 Exp(__m512 x) {
  const __m512 k = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(k, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(k, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  const __m512 e_r =
      _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  return _mm512_scalef_ps(e_r, k);
}

void ToF16(const float* x, uint16_t* y, int64_t n) {
  constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = j + 16 <= n ? static_cast<__mmask16>(0xffff) : TailMask(n - j);
    _mm256_mask_storeu_epi16(y + j, m, _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + j), kRound));
  }
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  const __m512 one = _mm512_set1_ps(1.0f);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = j + 16 <= n ? static_cast<__mmask16>(0xffff) : TailMask(n - j);
    const __m512 g = _mm512_maskz_loadu_ps(m, gate + j);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_setzero_ps(), g));
    const __m512 silu = _mm512_div_ps(g, _mm512_add_ps(one, e));
    _mm512_mask_storeu_ps(gate + j, m, _mm512_mul_ps(silu, _mm512_maskz_loadu_ps(m, up + j)));
  }
}

float ExpSum(float* x, int64_t n, float shift) {
  const __m512 vshift = _mm512_set1_ps(shift);
  __m512 sum = _mm512_setzero_ps();
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = j + 16 <= n ? static_cast<__mmask16>(0xffff) : TailMask(n - j);
    const __m512 e = Exp(_mm512_sub_ps(_mm512_maskz_loadu_ps(m, x + j), vshift));
    _mm512_mask_storeu_ps(x + j, m, e);
    sum = _mm512_mask_add_ps(sum, m, sum, e);
  }
  return HSum(sum);
}

float MaxF32(const float* x, int64_t n) {
  __m512 m = _mm512_set1_ps(x[0]);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 k = j + 16 <= n ? static_cast<__mmask16>(0xffff) : TailMask(n - j);
    m = _mm512_mask_max_ps(m, k, m, _mm512_maskz_loadu_ps(k, x + j));
  }
  return _mm512_reduce_max_ps(m);
}

// G query heads against S strips of up to 16 slots, each within one tile (the lanes; `m`
// masks shorter strips): each K vector widened once serves G FMAs into G independent chains,
// and each broadcast query value S FMAs. With one strip, 8 heads load 9 vectors (8 of them
// broadcasts) for 8 FMAs, and on cores with two FMA units a cycle the loads, not the FMAs, held
// it back: two strips, 10 loads for 16 FMAs (kernels_bench BM_AttentionKernels/part:0,
// 2026-12-04, alternated 4 rounds: 3.43, 3.42, 3.32, 3.31 -> 2.80, 2.80, 2.76, 2.82 us). On a
// core with one (2026-12-03) a standalone loop of the two-strip shape measured 47 us against
// one strip's 40 over 4,096 slots.
template <int G, int S>
void ScoresStrips(const uint16_t* const (&k)[S], __mmask16 m, float* s, int64_t ld,
                  const float* q, int64_t d, float scale, int64_t s_stride, Ahead& ahead) {
  __m512 acc[S][G];
  for (int t = 0; t < S; ++t) {
    for (int g = 0; g < G; ++g) acc[t][g] = _mm512_setzero_ps();
  }
  for (int64_t i = 0; i < d; ++i) {
    __m512 kv[S];
    for (int t = 0; t < S; ++t) {
      // A line per dimension (what two strips read of it), asked inside this loop: hoisted
      // above it, GCC 12 made the loop about 60% slower (BM_AttentionKernels/part:0).
      if (t == 0) ahead.Step();
      kv[t] = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, k[t] + i * ld));
    }
    for (int g = 0; g < G; ++g) {
      const __m512 qg = _mm512_set1_ps(q[g * d + i]);
      for (int t = 0; t < S; ++t) acc[t][g] = _mm512_fmadd_ps(qg, kv[t], acc[t][g]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int g = 0; g < G; ++g) {
    for (int t = 0; t < S; ++t) {
      _mm512_mask_storeu_ps(s + 16 * t + g * s_stride, m, _mm512_mul_ps(acc[t][g], vscale));
    }
  }
}

// Strips of up to 16 slots, each within one tile; two full ones at once where they follow.
void ScoresF16T(const uint16_t* k, int64_t ld, int64_t first, int64_t n, const float* q,
                int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
                Prefetch* prefetch) {
  Ahead ahead(prefetch);
  for (int64_t j = 0; j < n;) {
    const int64_t t = first + j;
    const int64_t lane = t % ld;
    int64_t r = ld - lane < 16 ? ld - lane : 16;
    if (n - j < r) r = n - j;
    const uint16_t* strip = k + (t / ld) * ld * d + lane;
    const int64_t lane2 = (t + 16) % ld;  // where a second strip would start
    if (r == 16 && n - j >= 32 && ld - lane2 >= 16) {
      const uint16_t* const pair[2] = {strip, k + (t + 16) / ld * ld * d + lane2};
      ByHeadGroups(n_g, [&]<int G>(int64_t g) {
        ScoresStrips<G, 2>(pair, 0xffff, s + j + g * s_stride, ld, q + g * d, d, scale,
                           s_stride, ahead);
      });
      j += 32;
      continue;
    }
    const uint16_t* const one[1] = {strip};
    ByHeadGroups(n_g, [&]<int G>(int64_t g) {
      ScoresStrips<G, 1>(one, TailMask(r), s + j + g * s_stride, ld, q + g * d, d, scale,
                         s_stride, ahead);
    });
    j += r;
  }
  ahead.Return(prefetch);
}

// The codes of 4 dimensions (rows ld bytes apart) x 16 slots, regrouped as [slot][4 dims]: each
// int32 lane then holds one slot's four codes, as vpdpbusd sums them. vpermw moves each lane's
// 4 slots' words of the 4 rows into that lane ([row][slot] within it), vpshufb transposes the
// lane's 4 x 4 bytes (vpermb would do both, but needs AVX512_VBMI, which this level does not
// require).
__m512i SlotQuads(const uint8_t* c, int64_t ld, __mmask16 m) {
  __m512i rows;
  if (ld == 16 && m == 0xffff) {
    rows = _mm512_loadu_si512(c);
  } else {
    rows = _mm512_zextsi128_si512(_mm_maskz_loadu_epi8(m, c));
    rows = _mm512_inserti32x4(rows, _mm_maskz_loadu_epi8(m, c + ld), 1);
    rows = _mm512_inserti32x4(rows, _mm_maskz_loadu_epi8(m, c + 2 * ld), 2);
    rows = _mm512_inserti32x4(rows, _mm_maskz_loadu_epi8(m, c + 3 * ld), 3);
  }
  // Lane L's word p is row p / 2's word 2L + p % 2 (its slots 4L + 2 (p % 2) and the next).
  const __m512i words = _mm512_set_epi16(
      31, 30, 23, 22, 15, 14, 7, 6, 29, 28, 21, 20, 13, 12, 5, 4,  //
      27, 26, 19, 18, 11, 10, 3, 2, 25, 24, 17, 16, 9, 8, 1, 0);
  // Byte o of a lane is slot o / 4's row o % 4.
  const __m512i bytes = _mm512_broadcast_i32x4(
      _mm_setr_epi8(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15));
  return _mm512_shuffle_epi8(_mm512_permutexvar_epi16(words, rows), bytes);
}

// G query heads against 16 slots of a Q8_0 K stored dimension-major (`m` masks a last, shorter
// strip), with VNNI: vpdpbusd multiplies unsigned by signed bytes, so the codes go in as
// code + 128 (a flipped sign bit, once per 4 dimensions for all G heads) against the query's
// own codes, and each group's dot loses 128 * the query's sum of codes again, in floats
// through the block's sum (d * that sum). The integer sums are exact.
template <int G>
void ScoresQ8Strip(const uint8_t* k, const Q8DimsLayout& lay, int64_t j, __mmask16 m,
                   const BlockQ8Act* q, int64_t d, float scale, float* s, int64_t s_stride,
                   Ahead& ahead) {
  const int64_t groups = d / kQK;
  const __m512i sign = _mm512_set1_epi8(static_cast<char>(0x80));
  __m512 acc[G];
  for (int g = 0; g < G; ++g) acc[g] = _mm512_setzero_ps();
  for (int64_t b = 0; b < groups; ++b) {
    __m512i dot[G];
    for (int g = 0; g < G; ++g) dot[g] = _mm512_setzero_si512();
    for (int64_t t = 0; t < kQK / 4; ++t) {
      ahead.Step();
      const __m512i codes =
          _mm512_xor_si512(SlotQuads(k + lay.CodeOffset(b, 4 * t, j), lay.slots, m), sign);
      for (int g = 0; g < G; ++g) {
        int32_t four;
        std::memcpy(&four, q[g * groups + b].qs + 4 * t, sizeof four);
        dot[g] = _mm512_dpbusd_epi32(dot[g], codes, _mm512_set1_epi32(four));
      }
    }
    const auto* sc = reinterpret_cast<const uint16_t*>(k + lay.ScaleOffset(b, j));
    const __m512 scales = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, sc));
    for (int g = 0; g < G; ++g) {
      const BlockQ8Act& qb = q[g * groups + b];
      const __m512 part = _mm512_fmsub_ps(_mm512_cvtepi32_ps(dot[g]), _mm512_set1_ps(qb.d),
                                          _mm512_set1_ps(128.0f * qb.sum));
      acc[g] = _mm512_fmadd_ps(part, scales, acc[g]);
    }
  }
  const __m512 vscale = _mm512_set1_ps(scale);
  for (int g = 0; g < G; ++g) {
    _mm512_mask_storeu_ps(s + g * s_stride, m, _mm512_mul_ps(acc[g], vscale));
  }
}

void ScoresQ8T(const uint8_t* k, int64_t ld, int64_t first, int64_t n, const BlockQ8Act* q,
               int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
               Prefetch* prefetch) {
  const Q8DimsLayout lay{ld};
  Ahead ahead(prefetch);
  for (int64_t j = 0; j < n; j += 16) {
    const __mmask16 m = j + 16 <= n ? static_cast<__mmask16>(0xffff) : TailMask(n - j);
    ByHeadGroups(n_g, [&]<int G>(int64_t g) {
      ScoresQ8Strip<G>(k, lay, first + j, m, q + g * (d / kQK), d, scale, s + g * s_stride + j,
                       s_stride, ahead);
    });
  }
  ahead.Return(prefetch);
}

// The same arithmetic as the reference, lane by lane: |x| and max are exact, d and 1/d are the
// same scalar operations, x * id is one rounding and roundscale rounds ties to even as
// nearbyint does, so the bits agree.
void QuantizeAct(const float* x, BlockQ8Act* xq, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    const __m512 v0 = _mm512_loadu_ps(xb);
    const __m512 v1 = _mm512_loadu_ps(xb + 16);
    const float amax = _mm512_reduce_max_ps(_mm512_max_ps(_mm512_abs_ps(v0), _mm512_abs_ps(v1)));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    xq[b].d = d;
    const __m512 vid = _mm512_set1_ps(id);
    constexpr int kRound = _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC;
    const __m512i q0 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v0, vid), kRound));
    const __m512i q1 = _mm512_cvtps_epi32(_mm512_roundscale_ps(_mm512_mul_ps(v1, vid), kRound));
    xq[b].sum = d * static_cast<float>(_mm512_reduce_add_epi32(_mm512_add_epi32(q0, q1)));
    // |q| <= 127, so the saturating narrowing is exact.
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq[b].qs), _mm512_cvtsepi32_epi8(q0));
    _mm_storeu_si128(reinterpret_cast<__m128i*>(xq[b].qs + 16), _mm512_cvtsepi32_epi8(q1));
  }
}

// How ActTile reads one kind of weight block as 32 integers for vpdpbusd, which multiplies
// unsigned by signed bytes, four products (each exact) summed into an int32 lane:
//   Q8_0  signed q: the dot moves q's signs onto x, |q| * (x with q's sign), |q| <= 128;
//   Q4_0  the nibbles n = q + 8, already unsigned: the lanes start from -8 * (their four x's
//         sum), once per activation block for all rows, and add n * x.
// Either way each int32 lane ends as sum q * x over its four elements, exactly.
struct Q8_0Ints {
  using Block = BlockQ8_0;
  static __m256i Load(const BlockQ8_0& b) {
    return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b.qs));
  }
  static __m256i Start(__m256i /*x*/) { return _mm256_setzero_si256(); }
  static __m256i Dot(__m256i start, __m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(start, _mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
  }
  // Two consecutive blocks, one per 256-bit half.
  static __m512i Load2(const BlockQ8_0* b) {
    return _mm512_inserti64x4(_mm512_castsi256_si512(Load(b[0])), Load(b[1]), 1);
  }
  static __m512i Start2(__m512i /*x*/) { return _mm512_setzero_si512(); }
  static __m512i Dot2(__m512i start, __m512i w, __m512i x) {
    // x negated where q < 0 (AVX-512 has no vpsignb; where q = 0 the product is 0 either way).
    const __m512i x_signed = _mm512_mask_sub_epi8(x, _mm512_movepi8_mask(w),
                                                  _mm512_setzero_si512(), x);
    return _mm512_dpbusd_epi32(start, _mm512_abs_epi8(w), x_signed);
  }
};

struct Q4_0Ints {
  using Block = BlockQ4_0;
  static __m256i Load(const BlockQ4_0& b) {
    // Byte j holds element j in its low nibble and element j + 16 in its high nibble: the 16
    // bytes go to both halves, the upper half shifted down by 4, then both masked.
    const __m256i both = _mm256_broadcastsi128_si256(
        _mm_loadu_si128(reinterpret_cast<const __m128i*>(b.qs)));
    const __m256i shifts = _mm256_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4);
    return _mm256_and_si256(_mm256_srlv_epi32(both, shifts), _mm256_set1_epi8(0x0f));
  }
  static __m256i Start(__m256i x) {
    return _mm256_sub_epi32(_mm256_setzero_si256(),
                            _mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(8), x));
  }
  static __m256i Dot(__m256i start, __m256i w, __m256i x) {
    return _mm256_dpbusd_epi32(start, w, x);
  }
  static __m512i Load2(const BlockQ4_0* b) {
    const __m512i both = _mm512_inserti64x4(
        _mm512_castsi256_si512(_mm256_broadcastsi128_si256(
            _mm_loadu_si128(reinterpret_cast<const __m128i*>(b[0].qs)))),
        _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b[1].qs))),
        1);
    const __m512i shifts = _mm512_setr_epi32(0, 0, 0, 0, 4, 4, 4, 4, 0, 0, 0, 0, 4, 4, 4, 4);
    return _mm512_and_si512(_mm512_srlv_epi32(both, shifts), _mm512_set1_epi8(0x0f));
  }
  static __m512i Start2(__m512i x) {
    return _mm512_sub_epi32(_mm512_setzero_si512(),
                            _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_set1_epi8(8), x));
  }
  static __m512i Dot2(__m512i start, __m512i w, __m512i x) {
    return _mm512_dpbusd_epi32(start, w, x);
  }
};

// The f16 scale d in all 8 lanes: a broadcast load and one conversion, no scalar work.
__m256 BroadcastScale(const uint16_t* d) {
  return _mm256_cvtph_ps(_mm_set1_epi16(static_cast<short>(*d)));
}

// d0 in the low 8 lanes, d1 in the high 8.
__m512 BroadcastScales(const uint16_t* d0, const uint16_t* d1) {
  return _mm512_cvtph_ps(_mm256_set_m128i(_mm_set1_epi16(static_cast<short>(*d1)),
                                          _mm_set1_epi16(static_cast<short>(*d0))));
}

// R weight rows x T tokens of quantized activations, every (row, token) with the same
// operations in the same order whatever R and T are: blocks alternate between two
// accumulators (so consecutive FMAs do not wait on each other), which are added at the end.
// One block's term is acc += (f32(sum_j w[j] * x[j]) * d_w) * d_x. Each loaded weight block
// serves T tokens and each activation block R rows. `ahead` is how many bytes past each
// block in use to prefetch.
//
// The two accumulators are the halves of one zmm register, and a step takes a pair of blocks,
// the even one in the low half: the unpacking, conversion and scaling of two blocks cost one
// 512-bit instruction each instead of two 256-bit ones. Lane for lane they are the operations
// of two 256-bit steps, so every sum is the same, bit for bit.
// The activation side of a step: one token's pair of blocks i, i + 1 as ActTile uses them.
struct ActPair {
  __m512i x;
  __m512i start;
  __m512 dx;
};

template <class Ints>
ActPair PrepareActPair(const BlockQ8Act* xq) {
  ActPair p;
  p.x = _mm512_inserti64x4(
      _mm512_castsi256_si512(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[0].qs))),
      _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq[1].qs)), 1);
  p.start = Ints::Start2(p.x);
  p.dx = _mm512_insertf32x8(_mm512_set1_ps(xq[0].d), _mm256_set1_ps(xq[1].d), 1);
  return p;
}

// A last, odd block i of one row and token, added to the even blocks' accumulator.
template <class Ints>
__m256 AddOddLastBlock(const typename Ints::Block& w, const BlockQ8Act& xq, __m256 even) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(xq.qs));
  const __m256i dot = Ints::Dot(Ints::Start(x), Ints::Load(w), x);
  const __m256 sum = _mm256_mul_ps(_mm256_cvtepi32_ps(dot), BroadcastScale(&w.d));
  return _mm256_fmadd_ps(sum, _mm256_set1_ps(xq.d), even);
}

// The even blocks' sums in the low half of acc, the odd ones' in the high half.
float SumHalves(__m256 even, __m512 acc) {
  const __m256 odd = _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(acc), 1));
  return HSum(_mm256_add_ps(even, odd));
}

template <class Ints, int R, int T>
void ActTile(const typename Ints::Block* const rows[R], const BlockQ8Act* const xq[T], int64_t n,
             float* y, int64_t y_stride, int64_t ahead) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  const int64_t nb = n / kQK;
  int64_t i = 0;
  for (; i + 2 <= nb; i += 2) {
    ActPair p[T];
    for (int t = 0; t < T; ++t) p[t] = PrepareActPair<Ints>(&xq[t][i]);
    for (int r = 0; r < R; ++r) {
      // A pair is 36 (Q4_0) or 68 (Q8_0) bytes: one prefetch per 64-byte line at most.
      const char* pair = reinterpret_cast<const char*>(&rows[r][i]);
      _mm_prefetch(pair + ahead, _MM_HINT_T0);
      if (sizeof(typename Ints::Block) * 2 > 64) _mm_prefetch(pair + ahead + 64, _MM_HINT_T0);
      const __m512i w = Ints::Load2(&rows[r][i]);
      const __m512 dw = BroadcastScales(&rows[r][i].d, &rows[r][i + 1].d);
      for (int t = 0; t < T; ++t) {
        const __m512 sum =
            _mm512_mul_ps(_mm512_cvtepi32_ps(Ints::Dot2(p[t].start, w, p[t].x)), dw);
        acc[r][t] = _mm512_fmadd_ps(sum, p[t].dx, acc[r][t]);
      }
    }
  }
  __m256 even[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) even[r][t] = _mm512_castps512_ps256(acc[r][t]);
  }
  if (i < nb) {  // an odd last block joins the even ones
    for (int t = 0; t < T; ++t) {
      for (int r = 0; r < R; ++r) {
        even[r][t] = AddOddLastBlock<Ints>(rows[r][i], xq[t][i], even[r][t]);
      }
    }
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) y[t * y_stride + r] = SumHalves(even[r][t], acc[r][t]);
  }
}

template <class Ints>
float DotActBlocks(const void* row, const BlockQ8Act* xq, int64_t n) {
  const typename Ints::Block* rows[1] = {static_cast<const typename Ints::Block*>(row)};
  const BlockQ8Act* xqs[1] = {xq};
  float y;
  // Rows of a matrix are consecutive: prefetch the next one.
  const auto row_bytes = static_cast<int64_t>(sizeof(typename Ints::Block)) * (n / kQK);
  ActTile<Ints, 1, 1>(rows, xqs, n, &y, 1, row_bytes);
  return y;
}

// Up to 4 rows x 2 tokens: 8 accumulators, each token's prepared pair (3 registers) and the
// loaded pair of blocks fit the 32 vector registers.
template <class Ints, int R>
void ActTileRows(const ActTileArgs& a) {
  const typename Ints::Block* rows[R];
  for (int r = 0; r < R; ++r) {
    rows[r] = reinterpret_cast<const typename Ints::Block*>(a.w + r * a.row_bytes);
  }
  // Each row prefetches the same block of the next tile's row: one tile ahead, the distance
  // the loop needs whatever the row length (a fixed distance shorter than the tile would only
  // fetch the tile's own rows).
  const int64_t ahead = static_cast<int64_t>(kTileRows * a.row_bytes);
  int64_t t = 0;
  for (; t + 2 <= a.n_tok; t += 2) {
    const BlockQ8Act* xq[2] = {a.xq + t * a.xq_stride, a.xq + (t + 1) * a.xq_stride};
    ActTile<Ints, R, 2>(rows, xq, a.n, a.y + t * a.y_stride, a.y_stride, ahead);
  }
  if (t < a.n_tok) {
    const BlockQ8Act* xq[1] = {a.xq + t * a.xq_stride};
    ActTile<Ints, R, 1>(rows, xq, a.n, a.y + t * a.y_stride, a.y_stride, ahead);
  }
}

// Most pairs of activation blocks DecodeRows prepares (16,384 columns, 48 KiB of stack).
constexpr int64_t kMaxPreparedPairs = 256;

// Decode: the rows one after another, one sequential stream, which the memory system serves
// faster than a tile's rows side by side (Q8_0 tg128 +8-10% in alternated runs), against one
// token whose activation side of each pair of blocks is prepared once for all the rows.
// Operation for operation ActTile<Ints, 1, 1>, so a row's sum is a tile's, bit for bit.
template <class Ints>
void DecodeRows(const ActTileArgs& a) {
  const int64_t nb = a.n / kQK, pairs = nb / 2;
  if (pairs > kMaxPreparedPairs) {
    const BlockQ8Act* xq[1] = {a.xq};
    for (int r = 0; r < a.n_rows; ++r) {
      const typename Ints::Block* row[1] = {
          reinterpret_cast<const typename Ints::Block*>(a.w + r * a.row_bytes)};
      ActTile<Ints, 1, 1>(row, xq, a.n, a.y + r, a.y_stride, kDotPrefetchBytes);
    }
    return;
  }
  ActPair prep[kMaxPreparedPairs];
  for (int64_t p = 0; p < pairs; ++p) prep[p] = PrepareActPair<Ints>(&a.xq[2 * p]);
  for (int r = 0; r < a.n_rows; ++r) {
    const auto* row = reinterpret_cast<const typename Ints::Block*>(a.w + r * a.row_bytes);
    __m512 acc = _mm512_setzero_ps();
    for (int64_t p = 0; p < pairs; ++p) {
      const char* pair = reinterpret_cast<const char*>(&row[2 * p]);
      _mm_prefetch(pair + kDotPrefetchBytes, _MM_HINT_T0);
      if (sizeof(typename Ints::Block) * 2 > 64) {
        _mm_prefetch(pair + kDotPrefetchBytes + 64, _MM_HINT_T0);
      }
      const __m512i w = Ints::Load2(&row[2 * p]);
      const __m512 dw = BroadcastScales(&row[2 * p].d, &row[2 * p + 1].d);
      const __m512 sum =
          _mm512_mul_ps(_mm512_cvtepi32_ps(Ints::Dot2(prep[p].start, w, prep[p].x)), dw);
      acc = _mm512_fmadd_ps(sum, prep[p].dx, acc);
    }
    __m256 even = _mm512_castps512_ps256(acc);
    if (nb % 2 != 0) even = AddOddLastBlock<Ints>(row[nb - 1], a.xq[nb - 1], even);
    a.y[r] = SumHalves(even, acc);
  }
}

template <class Ints>
void DotActTileBlocks(const ActTileArgs& a) {
  static_assert(kTileRows == 4);
  if (a.n_tok == 1) return DecodeRows<Ints>(a);
  switch (a.n_rows) {
    case 4:
      return ActTileRows<Ints, 4>(a);
    case 3:
      return ActTileRows<Ints, 3>(a);
    case 2:
      return ActTileRows<Ints, 2>(a);
    default:
      return ActTileRows<Ints, 1>(a);
  }
}

void DotActTile(const ActTileArgs& a) {
  if (a.wt == DType::kQ8_0) return DotActTileBlocks<Q8_0Ints>(a);
  DotActTileBlocks<Q4_0Ints>(a);
}

float DotAct(DType t, const void* row, const BlockQ8Act* xq, int64_t n) {
  if (t == DType::kQ8_0) return DotActBlocks<Q8_0Ints>(row, xq, n);
  return DotActBlocks<Q4_0Ints>(row, xq, n);
}

// The codes of one interleaved block (its qs) as 8 vectors: vector j holds the 16 rows' quads
// that meet the activations' quad j (codes 4j .. 4j + 3), each code plus kOffset, unsigned,
// and vectors 4 .. 7 times 2^kHighShift.
struct Q4_0x16Codes {
  static constexpr bool kLeanDecode = true;  // Act16DecodeGroup
  static constexpr int kOffsetShift = 3;
  static constexpr int kOffset = 1 << kOffsetShift;
  // The high nibbles stay in place, 16 times their value (one AND a line instead of a shift
  // and an AND); the high chain's sum, a multiple of 16, is shifted back exactly.
  static constexpr int kHighShift = 4;
  static constexpr int64_t kBlockBytes = sizeof(BlockQ4_0x16);
  // kFolded: each line loaded by both of its ANDs (two loads, no instruction of its own).
  // Otherwise in a register: from L2 the loads bound prefill's loop more than the multiplies
  // do; streaming from memory, decode's loop goes faster the fewer instructions it has in
  // flight per byte (Act16DecodeGroup).
  template <bool kFolded = false>
  static void Load(const uint8_t* qs, __m512i c[8]) {
    const __m512i low = _mm512_set1_epi8(0x0f);
    const __m512i high = _mm512_set1_epi8(static_cast<char>(0xf0));
    for (int j = 0; j < 4; ++j) {
      __m512i v = _mm512_loadu_si512(qs + 64 * j);
      if (!kFolded) __asm__("" : "+v"(v));
      c[j] = _mm512_and_si512(v, low);
      c[4 + j] = _mm512_and_si512(v, high);
    }
  }
};

struct Q8_0x16Codes {
  // Act16DecodeGroup was no faster for Q8_0, whose 8 loads a block already outnumber its
  // other instructions: its decode steps took 0.99-1.07 times as long (docs/performance.md).
  static constexpr bool kLeanDecode = false;
  static constexpr int kOffsetShift = 7;
  static constexpr int kOffset = 1 << kOffsetShift;
  static constexpr int kHighShift = 0;
  static constexpr int64_t kBlockBytes = sizeof(BlockQ8_0x16);
  static void Load(const uint8_t* qs, __m512i c[8]) {
    for (int j = 0; j < 8; ++j) c[j] = _mm512_loadu_si512(qs + 64 * j);
  }
};

// The activations' quad j of a block in every int32 lane.
__m512i BroadcastQuad(const BlockQ8Act& x, int j) {
  int32_t quad;
  std::memcpy(&quad, x.qs + 4 * j, sizeof(quad));
  return _mm512_set1_epi32(quad);
}

// Block b of a group (its qs, and its 16 scales in dw) against T tokens from t0, into acc.
// Inlined: called three times in Act16Group, it would otherwise keep acc in memory.
template <class Codes, int T>
[[gnu::always_inline]] inline void Act16Block(const Act16Args& a, int64_t b, const uint8_t* qs,
                                              __m512 dw, int64_t t0, __m512 acc[T]) {
  __m512i c[8];
  Codes::Load(qs, c);
  for (int t = 0; t < T; ++t) {
    const int64_t at = (t0 + t) * a.xq_stride + b;
    const BlockQ8Act& x = a.xq[at];
    // Two chains of four, started at -offset * the codes' sum, which the offset added.
    __m512i lo = _mm512_set1_epi32(-Codes::kOffset * a.xsum[at]);
    __m512i hi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      lo = _mm512_dpbusd_epi32(lo, c[j], BroadcastQuad(x, j));
      hi = _mm512_dpbusd_epi32(hi, c[4 + j], BroadcastQuad(x, 4 + j));
    }
    if (Codes::kHighShift != 0) hi = _mm512_srai_epi32(hi, Codes::kHighShift);
    const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), dw);
    acc[t] = _mm512_fmadd_ps(s, _mm512_set1_ps(x.d), acc[t]);
  }
}

// One group of 16 interleaved rows against T tokens from t0: each block's codes are unpacked
// once for the T tokens, and each row's sum stays in its own lane (the contract's order). A
// pair of blocks opens with one line of both blocks' scales (Interleaved16Layout).
template <class Codes, int T>
void Act16Group(const Act16Args& a, int64_t g, int64_t t0) {
  constexpr int64_t kScaleBytes = Interleaved16Layout::kScaleBytes;
  constexpr int64_t kQsBytes = Codes::kBlockBytes - kScaleBytes;
  const int64_t nb = a.n / kQK;
  const uint8_t* group = a.w + g * nb * Codes::kBlockBytes;
  __m512 acc[T];
  for (int t = 0; t < T; ++t) acc[t] = _mm512_setzero_ps();
  int64_t b = 0;
  for (; b + 2 <= nb; b += 2) {
    const uint8_t* pair = group + b * Codes::kBlockBytes;
    const __m512i d = _mm512_loadu_si512(pair);
    const uint8_t* qs = pair + 2 * kScaleBytes;
    Act16Block<Codes, T>(a, b, qs, _mm512_cvtph_ps(_mm512_castsi512_si256(d)), t0, acc);
    Act16Block<Codes, T>(a, b + 1, qs + kQsBytes,
                         _mm512_cvtph_ps(_mm512_extracti64x4_epi64(d, 1)), t0, acc);
  }
  if (b < nb) {
    const uint8_t* last = group + b * Codes::kBlockBytes;
    const __m512 dw = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(last)));
    Act16Block<Codes, T>(a, b, last + kScaleBytes, dw, t0, acc);
  }
  for (int t = 0; t < T; ++t) _mm512_storeu_ps(a.y + (t0 + t) * a.y_stride + 16 * g, acc[t]);
}

// acc += the int32 dot of codes' quads (unsigned) with one activation quad (signed) in every
// lane, the quad an embedded broadcast: GCC loads _mm512_set1_epi32 into a register of its
// own, one more instruction per multiply in the out-of-order window.
[[gnu::always_inline]] inline __m512i DotBroadcastQuad(__m512i acc, __m512i codes,
                                                       const int8_t* quad) {
  __asm__("vpdpbusd %2%{1to16%}, %1, %0"
          : "+v"(acc)
          : "v"(codes), "m"(*reinterpret_cast<const int32_t*>(quad)));
  return acc;
}

// Act16Group<Codes, 1> with fewer instructions per byte of weights: streaming from memory,
// the loop reads faster the fewer instructions it has in flight per byte (the same loop
// padded with no-ops streams slower), and Q4_0 has the most arithmetic a byte. The quads are
// embedded broadcasts, each block's scales are converted straight from memory, the offset
// comes off in vector registers (a broadcast load and a shift instead of four integer
// steps), each line of codes is loaded by its two ANDs, and two pairs of blocks make one
// turn of the loop (four made it far slower); the last two took Q4_0 decode steps 11-16%
// shorter (docs/performance.md).
template <class Codes>
void Act16DecodeGroup(const Act16Args& a, int64_t g, int64_t t) {
  constexpr int64_t kScaleBytes = Interleaved16Layout::kScaleBytes;
  constexpr int64_t kQsBytes = Codes::kBlockBytes - kScaleBytes;
  const int64_t nb = a.n / kQK;
  const uint8_t* group = a.w + g * nb * Codes::kBlockBytes;
  const BlockQ8Act* xq = a.xq + t * a.xq_stride;
  const int32_t* xsum = a.xsum + t * a.xq_stride;
  __m512 acc = _mm512_setzero_ps();
  const auto block = [&](int64_t b, const uint8_t* scales, const uint8_t* qs) {
    __m512i c[8];
    Codes::template Load<true>(qs, c);
    __m512i lo = _mm512_setzero_si512(), hi = _mm512_setzero_si512();
    for (int j = 0; j < 4; ++j) {
      lo = DotBroadcastQuad(lo, c[j], xq[b].qs + 4 * j);
      hi = DotBroadcastQuad(hi, c[4 + j], xq[b].qs + 16 + 4 * j);
    }
    if (Codes::kHighShift != 0) hi = _mm512_srai_epi32(hi, Codes::kHighShift);
    lo = _mm512_sub_epi32(lo, _mm512_slli_epi32(_mm512_set1_epi32(xsum[b]), Codes::kOffsetShift));
    const __m512 dw =
        _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(scales)));
    const __m512 s = _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_add_epi32(lo, hi)), dw);
    acc = _mm512_fmadd_ps(s, _mm512_set1_ps(xq[b].d), acc);
  };
  int64_t b = 0;
  const auto pair_at = [&](int64_t first) {
    const uint8_t* pair = group + first * Codes::kBlockBytes;
    const uint8_t* qs = pair + 2 * kScaleBytes;
    block(first, pair, qs);
    block(first + 1, pair + kScaleBytes, qs + kQsBytes);
  };
  for (; b + 4 <= nb; b += 4) {
    pair_at(b);
    pair_at(b + 2);
  }
  for (; b + 2 <= nb; b += 2) pair_at(b);
  if (b < nb) {
    const uint8_t* last = group + b * Codes::kBlockBytes;
    block(b, last, last + kScaleBytes);
  }
  _mm512_storeu_ps(a.y + t * a.y_stride + 16 * g, acc);
}

// Decode runs one group after another (one sequential stream; a software prefetch ahead of
// it was no faster end to end, docs/performance.md); prefill
// takes 8 tokens at a time per group (8 codes + 8 sums in registers), then 4, 2 and 1 (one
// token: Act16DecodeGroup where Codes::kLeanDecode).
template <class Codes>
void DotAct16Blocks(const Act16Args& a) {
  for (int64_t g = 0; g < a.n_groups; ++g) {
    int64_t t = 0;
    for (; t + 8 <= a.n_tok; t += 8) Act16Group<Codes, 8>(a, g, t);
    if (t + 4 <= a.n_tok) {
      Act16Group<Codes, 4>(a, g, t);
      t += 4;
    }
    if (t + 2 <= a.n_tok) {
      Act16Group<Codes, 2>(a, g, t);
      t += 2;
    }
    if (t == a.n_tok) continue;
    if constexpr (Codes::kLeanDecode) {
      Act16DecodeGroup<Codes>(a, g, t);
    } else {
      Act16Group<Codes, 1>(a, g, t);
    }
  }
}

void DotAct16(const Act16Args& a) {
  if (a.wt == DType::kQ8_0) return DotAct16Blocks<Q8_0x16Codes>(a);
  DotAct16Blocks<Q4_0x16Codes>(a);
}

// R weight rows x T tokens: each x vector is loaded once for R FMAs and each w vector once
// for T, with R * T independent accumulators. 4 x 4 uses 16 accumulators + 4 w + 4 x of the
// 32 zmm registers. The last n % 16 columns are one masked step.
template <int R, int T>
void TileKernel(const TileArgs& a, const float* x, float* y) {
  __m512 acc[R][T];
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) acc[r][t] = _mm512_setzero_ps();
  }
  // Masked loads only for the tail: full-width masked loads are slower than plain ones.
  auto step = [&](int64_t i, auto load) {
    __m512 xv[T];
    for (int t = 0; t < T; ++t) xv[t] = load(x + t * a.x_stride + i);
    for (int r = 0; r < R; ++r) {
      __m512 wv = load(a.w + r * a.w_stride + i);
      // Pins wv in a register: otherwise GCC may fold the load into each of the T FMAs.
      __asm__("" : "+v"(wv));
      for (int t = 0; t < T; ++t) acc[r][t] = _mm512_fmadd_ps(wv, xv[t], acc[r][t]);
    }
  };
  int64_t i = 0;
  for (; i + 16 <= a.n; i += 16) step(i, [](const float* p) { return _mm512_loadu_ps(p); });
  if (i < a.n) {
    const __mmask16 m = TailMask(a.n - i);
    step(i, [m](const float* p) { return _mm512_maskz_loadu_ps(m, p); });
  }
  for (int r = 0; r < R; ++r) {
    for (int t = 0; t < T; ++t) {
      const float sum = HSum(acc[r][t]);
      float& out = y[t * a.y_stride + r];
      out = a.accumulate ? out + sum : sum;
    }
  }
}

template <int R>
void DotTileRows(const TileArgs& a) {
  int64_t t = 0;
  for (; t + 4 <= a.n_tok; t += 4) TileKernel<R, 4>(a, a.x + t * a.x_stride, a.y + t * a.y_stride);
  const float* x = a.x + t * a.x_stride;
  float* y = a.y + t * a.y_stride;
  switch (a.n_tok - t) {
    case 3:
      return TileKernel<R, 3>(a, x, y);
    case 2:
      return TileKernel<R, 2>(a, x, y);
    case 1:
      return TileKernel<R, 1>(a, x, y);
    default:
      return;
  }
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

// R float-type rows against one x, for decode: R sums in flight (8 cover the FMA latency at
// two FMAs a cycle) and each x vector loaded once for all R, where a dot per row keeps four
// and pays a horizontal sum per row. Each 64-byte line of the R rows asks the L2 for the same
// line of the next tile's rows (R rows further): R rows at a 4 KiB stride are R short streams
// that the hardware prefetchers pick up late at every tile. Into the L1 the request evicts
// lines still in use (docs/performance.md).
template <class Src, int R>
void RowsTile(const RowsArgs& a, int64_t r0) {
  using Elem = typename Src::Elem;
  constexpr int64_t kLine = 64 / sizeof(Elem);  // elements in one 64-byte line
  static_assert(kLine % 16 == 0);
  const Elem* w[R];
  for (int r = 0; r < R; ++r) w[r] = reinterpret_cast<const Elem*>(a.w + (r0 + r) * a.row_bytes);
  const int64_t next_tile = R * static_cast<int64_t>(a.row_bytes);
  __m512 acc[R];
  for (int r = 0; r < R; ++r) acc[r] = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + kLine <= a.n; i += kLine) {
    for (int r = 0; r < R; ++r) {
      _mm_prefetch(reinterpret_cast<const char*>(w[r] + i) + next_tile, _MM_HINT_T1);
    }
    for (int64_t j = i; j < i + kLine; j += 16) {
      const __m512 xv = _mm512_loadu_ps(a.x + j);
      for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(Src::Load(w[r] + j), xv, acc[r]);
    }
  }
  for (; i + 16 <= a.n; i += 16) {
    const __m512 xv = _mm512_loadu_ps(a.x + i);
    for (int r = 0; r < R; ++r) acc[r] = _mm512_fmadd_ps(Src::Load(w[r] + i), xv, acc[r]);
  }
  if (i < a.n) {
    const __mmask16 m = TailMask(a.n - i);
    const __m512 xv = _mm512_maskz_loadu_ps(m, a.x + i);
    for (int r = 0; r < R; ++r) {
      acc[r] = _mm512_fmadd_ps(Src::LoadMasked(m, w[r] + i), xv, acc[r]);
    }
  }
  for (int r = 0; r < R; ++r) a.y[r0 + r] = HSum(acc[r]);
}

// Tiles of 8 rows; the last n_rows % 8 one at a time (a dot's four chains).
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

// Float rows interleaved 16 at a time (InterleaveRows): a chunk of 32 columns is the 16 rows'
// 64-byte lines one after another, so a thread's share of a matrix is one stream of reads
// where RowsTile's 8 rows are 8 streams 4 KiB or more apart, which the hardware prefetchers
// pick up late at every tile; x is read in the chunks' order (FloatChunkOrder), not as a
// stream. Each x vector serves 16 rows, 16 sums in flight. Each line is
// asked for 4 KiB ahead into the L1 (F16 tg64, 6 alternated rounds: 19.21, 21.56, 21.42,
// 25.90, 23.83, 20.11 -> 23.94, 26.08, 25.90, 27.06, 25.47, 22.83 tokens/s; 2 KiB and 8 KiB
// gained less), where the same request slowed the quantized kernels' stream (DotAct16Blocks).
template <class Src>
void DotRows16Of(const Rows16Args& a) {
  constexpr int64_t kAheadBytes = 4096;
  constexpr int64_t kChunk = 32;
  const auto* w = reinterpret_cast<const typename Src::Elem*>(a.w);
  const FloatChunkOrder order(a.n / kChunk);
  for (int64_t g = 0; g < a.n_groups; ++g) {
    __m512 acc[16];
    for (__m512& v : acc) v = _mm512_setzero_ps();
    int64_t c = 0;  // the chunk at position i
    for (int64_t i = 0; i < order.n_chunks; ++i, w += 16 * kChunk) {
      const __m512 x0 = _mm512_loadu_ps(a.x + c * kChunk);
      const __m512 x1 = _mm512_loadu_ps(a.x + c * kChunk + 16);
      c += order.stride;
      if (c >= order.n_chunks) c -= order.n_chunks;
      for (int r = 0; r < 16; ++r) {
        _mm_prefetch(reinterpret_cast<const char*>(w + r * kChunk) + kAheadBytes, _MM_HINT_T0);
        acc[r] = _mm512_fmadd_ps(Src::Load(w + r * kChunk), x0, acc[r]);
        acc[r] = _mm512_fmadd_ps(Src::Load(w + r * kChunk + 16), x1, acc[r]);
      }
    }
    for (int r = 0; r < 16; ++r) a.y[16 * g + r] = HSum(acc[r]);
  }
}

void DotRows16(const Rows16Args& a) {
  if (a.wt == DType::kBF16) return DotRows16Of<BF16Src>(a);
  DotRows16Of<F16Src>(a);
}

template <class Src>
void Widen16Of(const uint8_t* group, const FloatChunkOrder& order, int64_t first_chunk,
               int64_t n_chunks, float* out, int64_t out_stride) {
  const auto* w = reinterpret_cast<const typename Src::Elem*>(group);
  const int64_t step = order.Inverse();
  int64_t position = first_chunk * step % order.n_chunks;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const auto* h = w + position * 16 * 32;
    for (int r = 0; r < 16; ++r, h += 32) {
      _mm512_storeu_ps(out + r * out_stride + 32 * c, Src::Load(h));
      _mm512_storeu_ps(out + r * out_stride + 32 * c + 16, Src::Load(h + 16));
    }
    position += step;  // the next chunk's
    if (position >= order.n_chunks) position -= order.n_chunks;
  }
}

void Widen16(DType wt, const uint8_t* group, const FloatChunkOrder& order, int64_t first_chunk,
             int64_t n_chunks, float* out, int64_t out_stride) {
  if (wt == DType::kBF16) {
    return Widen16Of<BF16Src>(group, order, first_chunk, n_chunks, out, out_stride);
  }
  Widen16Of<F16Src>(group, order, first_chunk, n_chunks, out, out_stride);
}

}  // namespace

const LevelKernels& Avx512LevelKernels() {
  static constexpr LevelKernels kLevel = {
      {SimdLevel::kAvx512, &Dot, &Axpy, &Dequantize, &DotF32, &WeightedRows, &ExpSum,
       &MaxF32, &ScoresF16T, &ScoresQ8T, &QuantizeAct, &DotAct, &SwiGlu, &ToF16,
       kPrefetchLead},
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
