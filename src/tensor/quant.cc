#include "tensor/quant.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

#include "base/status.h"
#include "tensor/fp16.h"

namespace kvllm {

namespace {

void QuantizeBlockQ8_0(const float* x, BlockQ8_0* b) {
  float amax = 0.0f;
  for (int j = 0; j < kQK; ++j) amax = std::max(amax, std::fabs(x[j]));
  const float d = amax / 127.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b->d = F32ToF16(d);
  for (int j = 0; j < kQK; ++j) b->qs[j] = static_cast<int8_t>(std::lround(x[j] * id));
}

void QuantizeBlockQ4_0(const float* x, BlockQ4_0* b) {
  // The scale maps the element of largest magnitude to -8 exactly, which gains one level over
  // a symmetric [-7, 7] range; the other sign then tops out at 7 (q = 15).
  float amax = 0.0f;
  float max = 0.0f;
  for (int j = 0; j < kQK; ++j) {
    if (std::fabs(x[j]) > amax) {
      amax = std::fabs(x[j]);
      max = x[j];
    }
  }
  const float d = max / -8.0f;
  const float id = d != 0.0f ? 1.0f / d : 0.0f;
  b->d = F32ToF16(d);
  for (int j = 0; j < kQK / 2; ++j) {
    // x * id lies in [-8, 8], so + 8.5 truncates to round-half-up in [0, 16]; 16 clamps to 15.
    const int lo = std::min(15, static_cast<int>(x[j] * id + 8.5f));
    const int hi = std::min(15, static_cast<int>(x[j + kQK / 2] * id + 8.5f));
    b->qs[j] = static_cast<uint8_t>(lo | (hi << 4));
  }
}

}  // namespace

void QuantizeRow(DType t, const float* x, void* row, int64_t n) {
  KVLLM_CHECK(n % BlockElems(t) == 0);
  switch (t) {
    case DType::kF32:
      std::memcpy(row, x, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      auto* out = static_cast<uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = F32ToF16(x[i]);
      return;
    }
    case DType::kBF16: {
      auto* out = static_cast<uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) out[i] = F32ToBF16(x[i]);
      return;
    }
    case DType::kQ8_0: {
      auto* blocks = static_cast<BlockQ8_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlockQ8_0(x + b * kQK, &blocks[b]);
      return;
    }
    case DType::kQ4_0: {
      auto* blocks = static_cast<BlockQ4_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) QuantizeBlockQ4_0(x + b * kQK, &blocks[b]);
      return;
    }
  }
}

void DequantizeRow(DType t, const void* row, float* y, int64_t n) {
  KVLLM_CHECK(n % BlockElems(t) == 0);
  switch (t) {
    case DType::kF32:
      std::memcpy(y, row, static_cast<size_t>(n) * sizeof(float));
      return;
    case DType::kF16: {
      const auto* in = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) y[i] = F16ToF32(in[i]);
      return;
    }
    case DType::kBF16: {
      const auto* in = static_cast<const uint16_t*>(row);
      for (int64_t i = 0; i < n; ++i) y[i] = BF16ToF32(in[i]);
      return;
    }
    case DType::kQ8_0: {
      const auto* blocks = static_cast<const BlockQ8_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = F16ToF32(blocks[b].d);
        float* yb = y + b * kQK;
        for (int j = 0; j < kQK; ++j) yb[j] = d * static_cast<float>(blocks[b].qs[j]);
      }
      return;
    }
    case DType::kQ4_0: {
      const auto* blocks = static_cast<const BlockQ4_0*>(row);
      for (int64_t b = 0; b < n / kQK; ++b) {
        const float d = F16ToF32(blocks[b].d);
        float* yb = y + b * kQK;
        for (int j = 0; j < kQK / 2; ++j) {
          const uint8_t q = blocks[b].qs[j];
          yb[j] = d * static_cast<float>((q & 0x0f) - 8);
          yb[j + kQK / 2] = d * static_cast<float>((q >> 4) - 8);
        }
      }
      return;
    }
  }
}

namespace {

// Groups of 16 rows of nb blocks each (`rows`) into groups of nb interleaved blocks laid out
// as Interleaved16Layout says, every byte of the codes plus `offset`.
template <class Block, class Block16>
void InterleaveBlocks(const void* rows, int64_t n_out, int64_t n, void* out, uint8_t offset) {
  const auto* in = static_cast<const Block*>(rows);
  const int64_t nb = n / kQK;
  const Interleaved16Layout layout{nb, sizeof(Block16)};
  constexpr int kQuads = sizeof(Block16::qs) / sizeof(Block16::qs[0]);
  for (int64_t g = 0; g < n_out / 16; ++g) {
    auto* group = static_cast<uint8_t*>(out) + g * layout.GroupBytes();
    for (int64_t b = 0; b < nb; ++b) {
      auto* d = reinterpret_cast<uint16_t*>(group + layout.ScaleOffset(b));
      uint8_t* qs = group + layout.QsOffset(b);
      for (int r = 0; r < 16; ++r) {
        const Block& src = in[(g * 16 + r) * nb + b];
        d[r] = src.d;
        for (int j = 0; j < kQuads; ++j) {
          for (int i = 0; i < 4; ++i) {
            const auto code = static_cast<uint8_t>(src.qs[4 * j + i]);
            qs[64 * j + 4 * r + i] = static_cast<uint8_t>(code + offset);
          }
        }
      }
    }
  }
}

}  // namespace

void ActCodeSums(const BlockQ8Act* xq, int64_t n_blocks, int32_t* sums) {
  for (int64_t b = 0; b < n_blocks; ++b) {
    int32_t sum = 0;
    for (int8_t q : xq[b].qs) sum += q;
    sums[b] = sum;
  }
}

FloatChunkOrder::FloatChunkOrder(int64_t n_chunks) : n_chunks(n_chunks), stride(0) {
  KVLLM_CHECK(n_chunks > 0);
  if (n_chunks == 1) return;  // position 0 holds chunk 0
  // A prime that does not divide n_chunks is coprime with it; one that leaves 1 would keep the
  // column order. No count up to 2^32 columns is ruled out by all of these.
  for (int64_t p : {17, 19, 23, 29, 31, 37}) {
    if (n_chunks % p != 0 && (n_chunks <= 2 || p % n_chunks != 1)) {
      stride = p % n_chunks;
      break;
    }
  }
  KVLLM_CHECK(stride != 0);
}

int64_t FloatChunkOrder::Inverse() const {
  if (n_chunks == 1) return 0;
  // Extended Euclid: keeps r = stride x t (mod n_chunks) for both pairs until r reaches 1.
  int64_t r0 = n_chunks, t0 = 0, r1 = stride, t1 = 1;
  while (r1 != 1) {
    const int64_t q = r0 / r1;
    r0 = std::exchange(r1, r0 - q * r1);
    t0 = std::exchange(t1, t0 - q * t1);
  }
  return (t1 % n_chunks + n_chunks) % n_chunks;
}

void InterleaveRows(DType t, const void* rows, int64_t n_out, int64_t n, void* out) {
  KVLLM_CHECK(n_out % 16 == 0 && n % kQK == 0);
  if (t == DType::kF16 || t == DType::kBF16) {
    const auto* in = static_cast<const uint16_t*>(rows);
    auto* o = static_cast<uint16_t*>(out);
    const FloatChunkOrder order(n / kQK);
    for (int64_t g = 0; g < n_out / 16; ++g) {
      for (int64_t i = 0; i < order.n_chunks; ++i) {
        const int64_t c = order.ChunkAt(i);
        for (int64_t r = 0; r < 16; ++r, o += kQK) {
          std::copy_n(in + (g * 16 + r) * n + c * kQK, kQK, o);
        }
      }
    }
    return;
  }
  if (t == DType::kQ8_0) {
    // Codes + 128: the unsigned operand of vpdpbusd (two's complement wraps -128..127 onto
    // 0..255 in order).
    return InterleaveBlocks<BlockQ8_0, BlockQ8_0x16>(rows, n_out, n, out, 128);
  }
  KVLLM_CHECK(t == DType::kQ4_0);
  InterleaveBlocks<BlockQ4_0, BlockQ4_0x16>(rows, n_out, n, out, 0);
}

}  // namespace kvllm
