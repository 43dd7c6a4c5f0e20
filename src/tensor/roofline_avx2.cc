// AVX2 + FMA loops of the roofline (roofline.h). Like kernels_avx2.cc this file alone is
// compiled with those instruction sets, so it defines nothing with vague linkage.
#include <immintrin.h>

#include "tensor/roofline.h"

namespace kvllm::internal {

uint64_t ReadSum_avx2(const uint64_t* p, int64_t n) {
  // Four independent integer sums (one-cycle adds): the loop is bound by the loads alone.
  __m256i s0 = _mm256_setzero_si256(), s1 = s0, s2 = s0, s3 = s0;
  const auto* v = reinterpret_cast<const __m256i*>(p);
  for (int64_t i = 0; i < n / 4; i += 4) {  // 4 words a vector, 4 vectors (128 bytes) a turn
    s0 = _mm256_add_epi64(s0, _mm256_load_si256(v + i));
    s1 = _mm256_add_epi64(s1, _mm256_load_si256(v + i + 1));
    s2 = _mm256_add_epi64(s2, _mm256_load_si256(v + i + 2));
    s3 = _mm256_add_epi64(s3, _mm256_load_si256(v + i + 3));
  }
  const __m256i s = _mm256_add_epi64(_mm256_add_epi64(s0, s1), _mm256_add_epi64(s2, s3));
  const __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
  return static_cast<uint64_t>(_mm_cvtsi128_si64(h)) +
         static_cast<uint64_t>(_mm_extract_epi64(h, 1));
}

float FmaLoop_avx2(int64_t iters) {
  static_assert(kFmaChains == 12);
  // acc = acc * a + b converges to b / (1 - a): no overflow and no denormals however long.
  const __m256 a = _mm256_set1_ps(0.999f), b = _mm256_set1_ps(0.001f);
  __m256 c0 = _mm256_set1_ps(0.0f), c1 = _mm256_set1_ps(0.1f), c2 = _mm256_set1_ps(0.2f),
         c3 = _mm256_set1_ps(0.3f), c4 = _mm256_set1_ps(0.4f), c5 = _mm256_set1_ps(0.5f),
         c6 = _mm256_set1_ps(0.6f), c7 = _mm256_set1_ps(0.7f), c8 = _mm256_set1_ps(0.8f),
         c9 = _mm256_set1_ps(0.9f), c10 = _mm256_set1_ps(1.0f), c11 = _mm256_set1_ps(1.1f);
  for (int64_t i = 0; i < iters; ++i) {
    c0 = _mm256_fmadd_ps(c0, a, b);
    c1 = _mm256_fmadd_ps(c1, a, b);
    c2 = _mm256_fmadd_ps(c2, a, b);
    c3 = _mm256_fmadd_ps(c3, a, b);
    c4 = _mm256_fmadd_ps(c4, a, b);
    c5 = _mm256_fmadd_ps(c5, a, b);
    c6 = _mm256_fmadd_ps(c6, a, b);
    c7 = _mm256_fmadd_ps(c7, a, b);
    c8 = _mm256_fmadd_ps(c8, a, b);
    c9 = _mm256_fmadd_ps(c9, a, b);
    c10 = _mm256_fmadd_ps(c10, a, b);
    c11 = _mm256_fmadd_ps(c11, a, b);
  }
  __m256 s = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(c0, c1), _mm256_add_ps(c2, c3)),
                           _mm256_add_ps(_mm256_add_ps(c4, c5), _mm256_add_ps(c6, c7)));
  s = _mm256_add_ps(s, _mm256_add_ps(_mm256_add_ps(c8, c9), _mm256_add_ps(c10, c11)));
  __m128 h = _mm_add_ps(_mm256_castps256_ps128(s), _mm256_extractf128_ps(s, 1));
  h = _mm_add_ps(h, _mm_movehl_ps(h, h));
  h = _mm_add_ss(h, _mm_movehdup_ps(h));
  return _mm_cvtss_f32(h);
}

int64_t DotLoop_avx2(int64_t iters) {
  static_assert(kFmaChains == 12);
  const __m256i ones8 = _mm256_set1_epi8(1), ones16 = _mm256_set1_epi16(1);
  const __m256i lanes = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256i c[kFmaChains];
  for (int k = 0; k < kFmaChains; ++k) {
    c[k] = _mm256_add_epi32(_mm256_set1_epi32(DotLoopStart(k, 0)), lanes);
  }
  for (int64_t i = 0; i < iters; ++i) {
    // The bytes as unsigned times 1: pairs summed to 16 bits, then to 32, then added.
#pragma GCC unroll 12
    for (int k = 0; k < kFmaChains; ++k) {
      c[k] = _mm256_add_epi32(c[k], _mm256_madd_epi16(_mm256_maddubs_epi16(c[k], ones8), ones16));
    }
  }
  int64_t s = 0;
  for (int k = 0; k < kFmaChains; ++k) {
    alignas(32) int32_t v[8];
    _mm256_store_si256(reinterpret_cast<__m256i*>(v), c[k]);
    for (int32_t x : v) s += x;
  }
  return s;
}

}  // namespace kvllm::internal
