// Scalar IEEE half and bfloat16 conversions (round to nearest even). SIMD paths convert with
// F16C / AVX-512 instructions and are tested against these.
#pragma once

#include <cstdint>

namespace kvllm {

float F16ToF32(uint16_t h);
uint16_t F32ToF16(float f);
float BF16ToF32(uint16_t b);
uint16_t F32ToBF16(float f);

}  // namespace kvllm
