#include "kv/kivi.h"

#include <algorithm>
#include <limits>

#include "base/status.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"

namespace kvllm::kivi {
namespace {

// The largest f16 ≤ x and the smallest f16 ≥ x: with the minimum rounded down and the scale
// rounded up, (x − min) / scale never passes the top code.
uint16_t F16Down(float x) {
  const uint16_t h = F32ToF16(x);
  if (F16ToF32(h) <= x) return h;
  if ((h & 0x7fff) == 0) return 0x8001;  // ±0 → the negative subnormal next to it
  return (h & 0x8000) ? h + 1 : h - 1;
}

uint16_t F16Up(float x) {
  const uint16_t h = F32ToF16(x);
  if (F16ToF32(h) >= x) return h;
  if ((h & 0x7fff) == 0) return 0x0001;
  return (h & 0x8000) ? h - 1 : h + 1;
}

// Stores the parameters for values in [lo, hi] and returns them as floats (min, 1/scale).
void Params(int bits, float lo, float hi, uint16_t* scale16, uint16_t* min16, float* min,
            float* inv_scale) {
  *min16 = F16Down(lo);
  *min = F16ToF32(*min16);
  *scale16 = F16Up((hi - *min) / static_cast<float>((1 << bits) - 1));
  const float scale = F16ToF32(*scale16);
  *inv_scale = scale > 0 ? 1.0f / scale : 0.0f;
}

template <int kBits>
uint8_t Code(float x, float min, float inv_scale) {
  constexpr int kTop = (1 << kBits) - 1;
  const int c = static_cast<int>((x - min) * inv_scale + 0.5f);
  return static_cast<uint8_t>(std::clamp(c, 0, kTop));
}

// Packs the n codes of x[i] in planes (see kivi.h) against per-element parameters min[i],
// inv_scale[i] (stride 1) or a shared pair (stride 0).
template <int kBits>
void Pack(const float* x, const float* min, const float* inv_scale, int stride, uint8_t* out,
          int32_t n) {
  const int32_t n_bytes = n * kBits / 8;
  for (int32_t k = 0; k < n_bytes; ++k) {
    uint8_t byte = 0;
    for (int plane = 0; plane < 8 / kBits; ++plane) {
      const int32_t i = plane * n_bytes + k;
      byte |= Code<kBits>(x[i], min[i * stride], inv_scale[i * stride]) << (plane * kBits);
    }
    out[k] = byte;
  }
}

// y[i] = code i as a float, for n codes: one contiguous loop per plane, which vectorizes
// (__restrict: bytes may alias floats, which would otherwise force a reload per element).
template <int kBits>
void Unpack(const uint8_t* __restrict codes, float* __restrict y, int32_t n) {
  constexpr unsigned kMask = (1u << kBits) - 1;
  const int32_t n_bytes = n * kBits / 8;
  for (int plane = 0; plane < 8 / kBits; ++plane) {
    float* yp = y + plane * n_bytes;
    for (int32_t k = 0; k < n_bytes; ++k) {
      yp[k] = static_cast<float>((codes[k] >> (plane * kBits)) & kMask);
    }
  }
}

template <int kBits>
void QuantizeKTileT(const uint16_t* rows, int32_t block_size, int32_t head_dim, uint8_t* tile,
                    float* scratch) {
  const KernelSet& kern = Kernels();
  float* min = scratch;                 // [head_dim] low, then the stored minimum
  float* inv_scale = scratch + head_dim;  // [head_dim] high, then 1 / the stored scale
  float* row = scratch + 2 * head_dim;  // [head_dim]
  std::fill(min, min + head_dim, std::numeric_limits<float>::infinity());
  std::fill(inv_scale, inv_scale + head_dim, -std::numeric_limits<float>::infinity());
  for (int32_t j = 0; j < block_size; ++j) {
    kern.dequantize(DType::kF16, rows + static_cast<size_t>(j) * head_dim, row, head_dim);
    for (int32_t d = 0; d < head_dim; ++d) {
      min[d] = std::min(min[d], row[d]);
      inv_scale[d] = std::max(inv_scale[d], row[d]);
    }
  }
  auto* scale16 = reinterpret_cast<uint16_t*>(tile);  // [head_dim]
  uint16_t* min16 = scale16 + head_dim;                // [head_dim]
  for (int32_t d = 0; d < head_dim; ++d) {
    Params(kBits, min[d], inv_scale[d], &scale16[d], &min16[d], &min[d], &inv_scale[d]);
  }
  for (int32_t j = 0; j < block_size; ++j) {
    kern.dequantize(DType::kF16, rows + static_cast<size_t>(j) * head_dim, row, head_dim);
    Pack<kBits>(row, min, inv_scale, /*stride=*/1, tile + KCodesOffset(kBits, head_dim, j),
                head_dim);
  }
}

template <int kBits>
void QuantizeVRowT(const float* x, uint8_t* row, int32_t head_dim) {
  auto* groups = reinterpret_cast<KiviGroup<kBits>*>(row);
  for (int32_t g = 0; g < head_dim / kGroup; ++g) {
    const float* xg = x + g * kGroup;
    const auto [lo, hi] = std::minmax_element(xg, xg + kGroup);
    float min, inv_scale;
    Params(kBits, *lo, *hi, &groups[g].scale, &groups[g].min, &min, &inv_scale);
    Pack<kBits>(xg, &min, &inv_scale, /*stride=*/0, groups[g].codes, kGroup);
  }
}

template <int kBits>
void DequantizeVRowT(const uint8_t* row, float* y, int32_t head_dim) {
  const auto* groups = reinterpret_cast<const KiviGroup<kBits>*>(row);
  for (int32_t g = 0; g < head_dim / kGroup; ++g) {
    const float scale = F16ToF32(groups[g].scale), min = F16ToF32(groups[g].min);
    float* yg = y + g * kGroup;
    Unpack<kBits>(groups[g].codes, yg, kGroup);
    for (int i = 0; i < kGroup; ++i) yg[i] = min + scale * yg[i];
  }
}

}  // namespace

size_t KTileBytes(int bits, int32_t block_size, int32_t head_dim) {
  return 4 * static_cast<size_t>(head_dim) + block_size * KCodeRowBytes(bits, head_dim);
}

void QuantizeKTile(int bits, const uint16_t* rows, int32_t block_size, int32_t head_dim,
                   uint8_t* tile, float* scratch) {
  KVLLM_CHECK(bits == 4 || bits == 2);
  if (bits == 4) {
    QuantizeKTileT<4>(rows, block_size, head_dim, tile, scratch);
  } else {
    QuantizeKTileT<2>(rows, block_size, head_dim, tile, scratch);
  }
}

void KTileChannels(const uint8_t* tile, int32_t head_dim, float* scale, float* min) {
  const KernelSet& kern = Kernels();
  kern.dequantize(DType::kF16, tile, scale, head_dim);
  kern.dequantize(DType::kF16, tile + 2 * static_cast<size_t>(head_dim), min, head_dim);
}

void UnpackCodes(int bits, const uint8_t* codes, float* y, int32_t head_dim) {
  if (bits == 4) {
    Unpack<4>(codes, y, head_dim);
  } else {
    Unpack<2>(codes, y, head_dim);
  }
}

void DequantizeKSlot(int bits, const uint8_t* tile, int32_t slot, int32_t head_dim, float* y) {
  UnpackCodes(bits, tile + KCodesOffset(bits, head_dim, slot), y, head_dim);
  const auto* scale16 = reinterpret_cast<const uint16_t*>(tile);
  const uint16_t* min16 = scale16 + head_dim;
  for (int32_t d = 0; d < head_dim; ++d) y[d] = F16ToF32(min16[d]) + F16ToF32(scale16[d]) * y[d];
}

size_t VRowBytes(int bits, int32_t head_dim) {
  return static_cast<size_t>(head_dim / kGroup) *
         (bits == 4 ? sizeof(KiviGroup<4>) : sizeof(KiviGroup<2>));
}

void QuantizeVRow(int bits, const float* x, uint8_t* row, int32_t head_dim) {
  if (bits == 4) {
    QuantizeVRowT<4>(x, row, head_dim);
  } else {
    QuantizeVRowT<2>(x, row, head_dim);
  }
}

void DequantizeVRow(int bits, const uint8_t* row, float* y, int32_t head_dim) {
  if (bits == 4) {
    DequantizeVRowT<4>(row, y, head_dim);
  } else {
    DequantizeVRowT<2>(row, y, head_dim);
  }
}

}  // namespace kvllm::kivi
