// KIVI (Liu et al., "KIVI: A Tuning-Free Asymmetric 2bit Quantization for KV Cache", 2024):
// b-bit asymmetric integers, x ≈ min + scale · code with code in [0, 2^b − 1].
//
// K varies most across channels (a few channels carry large values in every token), so K is
// quantized per channel across the tokens of one block; V is quantized per token.
//
// K tile of one (layer, kv head) in one block of S tokens, head_dim D:
//
//   [scale: D f16][min: D f16][codes: S rows of D·b/8 bytes]
//    └ per channel d, over the S tokens ┘  └ token j's codes of the D channels
//
// V row of one token: D/32 groups of KiviGroup<b> (f16 scale, f16 min, 32 codes).
//
// Codes are packed in planes, as GGUF's Q4_0 packs its nibbles: of n codes in n·b/8 bytes,
// code i sits in byte i mod (n·b/8) at bit (i div (n·b/8))·b, so each plane unpacks with one
// contiguous loop (n = D for a K row, 32 for a V group). For n = 8:
//
//   4 bits:  byte k = code k | code k+4 << 4                                   (k < 4)
//   2 bits:  byte k = code k | code k+2 << 2 | code k+4 << 4 | code k+6 << 6   (k < 2)
//
// Rounding: the stored minimum is rounded down to f16 and the scale up, so every code lies in
// range without clamping and |x − x̂| ≤ scale / 2 for the stored scale: at most
// (hi − lo + 2^-10·|lo|) / (2·(2^b − 1)) · (1 + 2^-9) for a group spanning [lo, hi], i.e. 1/30
// of the range at 4 bits and 1/6 at 2 bits. Values must lie within f16's range, as for f16.
//
// Scalar code, templated on the bit width and written so that the compiler vectorizes it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvllm::kivi {

constexpr int kGroup = 32;  // V elements per scale/min pair

template <int kBits>
struct KiviGroup {
  uint16_t scale;  // f16
  uint16_t min;    // f16
  uint8_t codes[kGroup * kBits / 8];
};
static_assert(sizeof(KiviGroup<4>) == 20);
static_assert(sizeof(KiviGroup<2>) == 12);

// ---- K, per channel across a block ----

size_t KTileBytes(int bits, int32_t block_size, int32_t head_dim);
// Bytes of one token's codes in a K tile.
inline size_t KCodeRowBytes(int bits, int32_t head_dim) {
  return static_cast<size_t>(head_dim) * bits / 8;
}

// Quantizes the block's K of one head. rows: [block_size][head_dim] f16.
// scratch: [2][head_dim] floats.
void QuantizeKTile(int bits, const uint16_t* rows, int32_t block_size, int32_t head_dim,
                   uint8_t* tile, float* scratch);

// scale, min: [head_dim] floats, the tile's per-channel parameters.
void KTileChannels(const uint8_t* tile, int32_t head_dim, float* scale, float* min);
// Offset of token `slot`'s codes from the start of a K tile.
inline size_t KCodesOffset(int bits, int32_t head_dim, int32_t slot) {
  return 4 * static_cast<size_t>(head_dim) + slot * KCodeRowBytes(bits, head_dim);
}
// y[d] = code of channel d, as a float: [head_dim].
void UnpackCodes(int bits, const uint8_t* codes, float* y, int32_t head_dim);

// Token `slot` of a tile, dequantized: y [head_dim] (the reference path and tests).
void DequantizeKSlot(int bits, const uint8_t* tile, int32_t slot, int32_t head_dim, float* y);

// ---- V, per token ----

size_t VRowBytes(int bits, int32_t head_dim);
// x, y: [head_dim]; head_dim a multiple of kGroup.
void QuantizeVRow(int bits, const float* x, uint8_t* row, int32_t head_dim);
void DequantizeVRow(int bits, const uint8_t* row, float* y, int32_t head_dim);

}  // namespace kvllm::kivi
