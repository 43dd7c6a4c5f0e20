// AVX-512 loops of the roofline (roofline.h): the FMA peak, twice the lanes of the AVX2 loop,
// and the 8-bit dot peak of vpdpbusd. Like kernels_avx512.cc this file alone is compiled with
// those instruction sets, so it defines nothing with vague linkage.
#include "tensor/avx512_intrinsics.h"
#include "tensor/roofline.h"

namespace kvllm::internal {

float FmaLoop_avx512(int64_t iters) {
  // acc = acc * a + b converges to b / (1 - a): no overflow and no denormals however long.
  const __m512 a = _mm512_set1_ps(0.999f), b = _mm512_set1_ps(0.001f);
  __m512 c[kFmaChains];
  for (int k = 0; k < kFmaChains; ++k) c[k] = _mm512_set1_ps(0.1f * static_cast<float>(k));
  for (int64_t i = 0; i < iters; ++i) {
    // Fully unrolled, the chains live in registers (12 of the 32).
#pragma GCC unroll 12
    for (int k = 0; k < kFmaChains; ++k) c[k] = _mm512_fmadd_ps(c[k], a, b);
  }
  __m512 s = c[0];
  for (int k = 1; k < kFmaChains; ++k) s = _mm512_add_ps(s, c[k]);
  return _mm512_reduce_add_ps(s);
}

int64_t DotLoop_avx512(int64_t iters) {
  const __m512i ones = _mm512_set1_epi8(1);
  const __m512i lanes = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  __m512i c[kFmaChains];
  for (int k = 0; k < kFmaChains; ++k) {
    c[k] = _mm512_add_epi32(_mm512_set1_epi32(DotLoopStart(k, 0)), lanes);
  }
  for (int64_t i = 0; i < iters; ++i) {
#pragma GCC unroll 12
    for (int k = 0; k < kFmaChains; ++k) c[k] = _mm512_dpbusd_epi32(c[k], c[k], ones);
  }
  int64_t s = 0;
  for (int k = 0; k < kFmaChains; ++k) {
    s += _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_castsi512_si256(c[k])));
    s += _mm512_reduce_add_epi64(_mm512_cvtepi32_epi64(_mm512_extracti64x4_epi64(c[k], 1)));
  }
  return s;
}

}  // namespace kvllm::internal
