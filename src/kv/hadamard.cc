#include "kv/hadamard.h"

#include <cmath>

#include "base/status.h"

namespace kvllm {
namespace {

constexpr uint64_t kSignSeed = 0x6b766c6c6d2d4b52;  // fixed forever: stored K depends on it

// SplitMix64's output function: a well-mixed hash of the index.
constexpr uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9;
  z = (z ^ (z >> 27)) * 0x94d049bb133111eb;
  return z ^ (z >> 31);
}

void FlipSigns(float* x, int32_t n) {
  for (int32_t i = 0; i < n; ++i) {
    if (Mix(kSignSeed + static_cast<uint64_t>(i)) >> 63) x[i] = -x[i];
  }
}

// x ← H x / √n, in place (the fast Walsh-Hadamard transform, butterflies of growing span).
void NormalizedWalshHadamard(float* x, int32_t n) {
  KVLLM_CHECK(IsPowerOfTwo(n));
  for (int32_t span = 1; span < n; span *= 2) {
    for (int32_t i = 0; i < n; i += 2 * span) {
      for (int32_t j = i; j < i + span; ++j) {
        const float a = x[j], b = x[j + span];
        x[j] = a + b;
        x[j + span] = a - b;
      }
    }
  }
  const float norm = 1.0f / std::sqrt(static_cast<float>(n));
  for (int32_t i = 0; i < n; ++i) x[i] *= norm;
}

}  // namespace

void HadamardRotate(float* x, int32_t n) {
  FlipSigns(x, n);
  NormalizedWalshHadamard(x, n);
}

void HadamardUnrotate(float* x, int32_t n) {
  NormalizedWalshHadamard(x, n);
  FlipSigns(x, n);
}

}  // namespace kvllm
