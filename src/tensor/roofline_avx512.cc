// AVX-512 FMA loop of the roofline (roofline.h): the prefill ceiling for the AVX-512 kernels,
// twice the lanes of the AVX2 loop. Like kernels_avx512.cc this file alone is compiled with
// those instruction sets, so it defines nothing with vague linkage.
// GCC 12 warns, falsely, that the _mm512_undefined_* placeholders inside many AVX-512
// intrinsics are used uninitialized (GCC bug 105593). The warnings are silenced for the
// header's own lines only; this file's code is still checked.
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic pop
#endif

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

}  // namespace kvllm::internal
