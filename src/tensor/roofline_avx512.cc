// AVX-512 FMA loop of the roofline (roofline.h): the prefill ceiling for the AVX-512 kernels,
// twice the lanes of the AVX2 loop. Like kernels_avx512.cc this file alone is compiled with
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

}  // namespace kvllm::internal
