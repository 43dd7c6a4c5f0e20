// Randomized Walsh-Hadamard rotation of a head's vector, R = H·diag(s) / √n, for n = 2^k:
// H is the Sylvester Hadamard matrix (entries ±1, H·H = n·I) and s a fixed pseudo-random ±1
// pattern (one seed for the whole program, so K written now and a query rotated later agree).
// R is orthogonal, so (R q)·(R k) = q·k, while a value concentrated in one channel is spread
// evenly over all n: a per-group scale (q4_0) then fits the row's bulk instead of its outlier.
// QuaRot (Ashkboos et al. 2024) rotates K this way before quantizing it; the random signs keep
// a structured input (e.g. a constant row) from landing in a single channel again.
// Cost: n·log2(n) additions.
#pragma once

#include <cstdint>

namespace kvllm {

constexpr bool IsPowerOfTwo(int32_t n) { return n > 0 && (n & (n - 1)) == 0; }

// x: [n], n a power of two.
void HadamardRotate(float* x, int32_t n);    // x ← R x
void HadamardUnrotate(float* x, int32_t n);  // x ← Rᵀ x = R⁻¹ x

}  // namespace kvllm
