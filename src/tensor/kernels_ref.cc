// Scalar reference kernels: the oracle every SIMD level is tested against, and the fallback on
// CPUs without AVX2. Written for clarity; each follows the math of kernels.h literally.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "base/status.h"
#include "tensor/fp16.h"
#include "tensor/kernels_internal.h"
#include "tensor/quant.h"

namespace kvllm::internal {

namespace {

float DotF32(const float* a, const float* b, int64_t n) {
  float sum = 0.0f;
  for (int64_t i = 0; i < n; ++i) sum += a[i] * b[i];
  return sum;
}

float Dot(DType t, const void* row, const float* x, int64_t n) {
  switch (t) {
    case DType::kF32:
      return DotF32(static_cast<const float*>(row), x, n);
    case DType::kF16: {
      const auto* h = static_cast<const uint16_t*>(row);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) sum += F16ToF32(h[i]) * x[i];
      return sum;
    }
    case DType::kBF16: {
      const auto* b = static_cast<const uint16_t*>(row);
      float sum = 0.0f;
      for (int64_t i = 0; i < n; ++i) sum += BF16ToF32(b[i]) * x[i];
      return sum;
    }
    case DType::kQ8_0:
    case DType::kQ4_0:
      break;
  }
  // Block types: one block at a time through the reference dequantizer.
  const auto* bytes = static_cast<const uint8_t*>(row);
  const size_t block_bytes = BlockBytes(t);
  float sum = 0.0f;
  float w[kQK];
  for (int64_t b = 0; b < n / kQK; ++b) {
    DequantizeRow(t, bytes + b * block_bytes, w, kQK);
    sum += DotF32(w, x + b * kQK, kQK);
  }
  return sum;
}

void Axpy(DType t, const void* row, float a, float* y, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  const int64_t block = BlockElems(t);
  const size_t block_bytes = BlockBytes(t);
  // Dequantize through a small buffer so every type shares the loop.
  constexpr int64_t kChunk = 64;  // a multiple of kQK
  float w[kChunk];
  for (int64_t i = 0; i < n; i += kChunk) {
    const int64_t len = n - i < kChunk ? n - i : kChunk;
    DequantizeRow(t, bytes + (i / block) * block_bytes, w, len);
    for (int64_t j = 0; j < len; ++j) y[i + j] += a * w[j];
  }
}

void Dequantize(DType t, const void* row, float* y, int64_t n) { DequantizeRow(t, row, y, n); }

// A Q8_0 V in integers (kernels.h): per run of rows and block column, the weights p_j * d_j
// rounded to 16 bits against the run's largest scale.
void WeightedRowsQ8(const float* p, int64_t p_stride, int64_t n_g, const void* v, int64_t n,
                    int64_t d, float* y) {
  const auto* rows = static_cast<const uint8_t*>(v);
  const size_t row_bytes = RowBytes(DType::kQ8_0, d);
  auto block = [&](int64_t j, int64_t b) {
    return reinterpret_cast<const BlockQ8_0*>(rows + j * row_bytes) + b;
  };
  for (int64_t r0 = 0; r0 < n; r0 += kQ8VRunRows) {
    const int64_t end = std::min(n, r0 + kQ8VRunRows);
    for (int64_t b = 0; b < d / kQK; ++b) {
      float dmax = 0.0f;
      for (int64_t j = r0; j < end; ++j) dmax = std::max(dmax, std::fabs(F16ToF32(block(j, b)->d)));
      if (dmax == 0.0f) continue;  // every weight is 0: y stays
      const float to_int = 32767.0f / dmax, unscale = dmax / 32767.0f;
      for (int64_t g = 0; g < n_g; ++g) {
        int32_t sum[kQK] = {};
        for (int64_t j = r0; j < end; ++j) {
          // |p| <= 1 and |d_j| <= dmax: |w| <= 32767 * (1 + 2^-23), 16 bits after rounding.
          const float t = p[g * p_stride + j] * (F16ToF32(block(j, b)->d) * to_int);
          const auto w = static_cast<int32_t>(std::nearbyint(t));
          for (int i = 0; i < kQK; ++i) sum[i] += w * block(j, b)->qs[i];
        }
        float* out = y + g * d + b * kQK;
        for (int i = 0; i < kQK; ++i) {
          out[i] = std::fma(static_cast<float>(sum[i]), unscale, out[i]);
        }
      }
    }
  }
}

// The reference asks for no lines ahead: prefetching changes no result.
void WeightedRows(const float* p, int64_t p_stride, int64_t n_g, DType vt, const void* v,
                  int64_t n, int64_t d, float* y, Prefetch* /*ahead*/) {
  if (vt == DType::kQ8_0) return WeightedRowsQ8(p, p_stride, n_g, v, n, d, y);
  const auto* rows = static_cast<const uint8_t*>(v);
  std::vector<float> row(static_cast<size_t>(d));
  for (int64_t j = 0; j < n; ++j) {
    DequantizeRow(vt, rows + j * RowBytes(vt, d), row.data(), d);
    for (int64_t g = 0; g < n_g; ++g) {
      const float pj = p[g * p_stride + j];
      for (int64_t i = 0; i < d; ++i) y[g * d + i] += pj * row[i];
    }
  }
}

void SwiGlu(float* gate, const float* up, int64_t n) {
  for (int64_t j = 0; j < n; ++j) gate[j] = gate[j] / (1.0f + std::exp(-gate[j])) * up[j];
}

void ToF16(const float* x, uint16_t* y, int64_t n) {
  for (int64_t j = 0; j < n; ++j) y[j] = F32ToF16(x[j]);
}

float ExpSum(float* x, int64_t n, float shift) {
  float sum = 0.0f;
  for (int64_t j = 0; j < n; ++j) sum += (x[j] = std::exp(x[j] - shift));
  return sum;
}

void ScoresQ8T(const uint8_t* k, int64_t ld, int64_t first, int64_t n, const BlockQ8Act* q,
               int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
               Prefetch* /*ahead*/) {
  const Q8DimsLayout lay{ld};
  const int64_t groups = d / kQK;
  for (int64_t g = 0; g < n_g; ++g) {
    for (int64_t j = first; j < first + n; ++j) {
      float sum = 0.0f;
      for (int64_t b = 0; b < groups; ++b) {
        const BlockQ8Act& qb = q[g * groups + b];
        uint16_t dh;
        std::memcpy(&dh, k + lay.ScaleOffset(b, j), sizeof dh);
        int32_t dot = 0;
        for (int64_t i = 0; i < kQK; ++i) {
          dot += qb.qs[i] * static_cast<int8_t>(k[lay.CodeOffset(b, i, j)]);
        }
        sum += F16ToF32(dh) * qb.d * static_cast<float>(dot);
      }
      s[g * s_stride + j - first] = scale * sum;
    }
  }
}

float MaxF32(const float* x, int64_t n) {
  float m = x[0];
  for (int64_t j = 1; j < n; ++j) m = std::max(m, x[j]);
  return m;
}

void ScoresF16T(const uint16_t* k, int64_t ld, int64_t first, int64_t n, const float* q,
                int64_t n_g, int64_t d, float scale, float* s, int64_t s_stride,
                Prefetch* /*ahead*/) {
  for (int64_t g = 0; g < n_g; ++g) {
    for (int64_t j = 0; j < n; ++j) {
      const int64_t t = first + j;
      const uint16_t* kt = k + (t / ld) * ld * d + t % ld;
      float sum = 0.0f;
      for (int64_t i = 0; i < d; ++i) sum += q[g * d + i] * F16ToF32(kt[i * ld]);
      s[g * s_stride + j] = scale * sum;
    }
  }
}

void QuantizeAct(const float* x, BlockQ8Act* xq, int64_t n) {
  for (int64_t b = 0; b < n / kQK; ++b) {
    const float* xb = x + b * kQK;
    float amax = 0.0f;
    for (int j = 0; j < kQK; ++j) amax = std::fmax(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f;
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    xq[b].d = d;
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) {
      xq[b].qs[j] = static_cast<int8_t>(std::nearbyint(xb[j] * id));
      isum += xq[b].qs[j];
    }
    xq[b].sum = d * static_cast<float>(isum);
  }
}

// The block's weights as integers: q for Q8_0, the nibble minus 8 for Q4_0.
void BlockInts(DType t, const uint8_t* block, int w[kQK], float* d) {
  if (t == DType::kQ8_0) {
    const auto* b = reinterpret_cast<const BlockQ8_0*>(block);
    for (int j = 0; j < kQK; ++j) w[j] = b->qs[j];
    *d = F16ToF32(b->d);
    return;
  }
  const auto* b = reinterpret_cast<const BlockQ4_0*>(block);
  for (int j = 0; j < kQK / 2; ++j) {
    w[j] = (b->qs[j] & 0x0f) - 8;
    w[j + kQK / 2] = (b->qs[j] >> 4) - 8;
  }
  *d = F16ToF32(b->d);
}

float DotAct(DType t, const void* row, const BlockQ8Act* xq, int64_t n) {
  const auto* bytes = static_cast<const uint8_t*>(row);
  float sum = 0.0f;
  for (int64_t b = 0; b < n / kQK; ++b) {
    int w[kQK];
    float d;
    BlockInts(t, bytes + b * BlockBytes(t), w, &d);
    int32_t isum = 0;
    for (int j = 0; j < kQK; ++j) isum += w[j] * xq[b].qs[j];
    sum += d * xq[b].d * static_cast<float>(isum);
  }
  return sum;
}

// Row r's integers and scale in block b of an interleaved group, as they were before the
// interleaving.
void Block16Ints(DType t, const uint8_t* group, const Interleaved16Layout& layout, int64_t b,
                 int r, int w[kQK], float* d) {
  const uint8_t* qs = group + layout.QsOffset(b);
  uint16_t scale;
  std::memcpy(&scale, group + layout.ScaleOffset(b) + 2 * r, sizeof(scale));
  *d = F16ToF32(scale);
  for (int j = 0; j < kQK; ++j) {
    if (t == DType::kQ8_0) {
      w[j] = qs[64 * (j / 4) + 4 * r + j % 4] - 128;
    } else if (j < kQK / 2) {
      const uint8_t q = qs[64 * (j / 4) + 4 * r + j % 4];
      w[j] = (q & 0x0f) - 8;
      w[j + kQK / 2] = (q >> 4) - 8;
    }
  }
}

void DotAct16(const Act16Args& a) {
  const int64_t nb = a.n / kQK;
  const Interleaved16Layout layout{nb, static_cast<int64_t>(16 * BlockBytes(a.wt))};
  for (int64_t g = 0; g < a.n_groups; ++g) {
    for (int64_t t = 0; t < a.n_tok; ++t) {
      for (int r = 0; r < 16; ++r) {
        float acc = 0.0f;
        for (int64_t b = 0; b < nb; ++b) {
          int w[kQK];
          float d;
          Block16Ints(a.wt, a.w + g * layout.GroupBytes(), layout, b, r, w, &d);
          const BlockQ8Act& x = a.xq[t * a.xq_stride + b];
          int32_t isum = 0;
          for (int j = 0; j < kQK; ++j) isum += w[j] * x.qs[j];
          acc = std::fma(static_cast<float>(isum) * d, x.d, acc);
        }
        a.y[t * a.y_stride + 16 * g + r] = acc;
      }
    }
  }
}

void DotTile(const TileArgs& a) {
  for (int64_t t = 0; t < a.n_tok; ++t) {
    for (int r = 0; r < a.n_rows; ++r) {
      const float dot = DotF32(a.w + r * a.w_stride, a.x + t * a.x_stride, a.n);
      float& out = a.y[t * a.y_stride + r];
      out = a.accumulate ? out + dot : dot;
    }
  }
}

void DotRows(const RowsArgs& a) {
  for (int64_t r = 0; r < a.n_rows; ++r) a.y[r] = Dot(a.wt, a.w + r * a.row_bytes, a.x, a.n);
}

// Each row summed in Dot's order, so the two layouts give the same bits here.
void DotRows16(const Rows16Args& a) {
  KVLLM_CHECK(a.wt == DType::kF16 || a.wt == DType::kBF16);
  const auto widen = a.wt == DType::kF16 ? &F16ToF32 : &BF16ToF32;
  const auto* w = reinterpret_cast<const uint16_t*>(a.w);
  const FloatChunkOrder order(a.n / kQK);
  for (int64_t g = 0; g < a.n_groups; ++g) {
    for (int r = 0; r < 16; ++r) {
      float sum = 0.0f;
      for (int64_t c = 0; c < order.n_chunks; ++c) {
        const uint16_t* chunk = w + ((g * order.n_chunks + order.PositionOf(c)) * 16 + r) * kQK;
        for (int j = 0; j < kQK; ++j) sum += widen(chunk[j]) * a.x[c * kQK + j];
      }
      a.y[16 * g + r] = sum;
    }
  }
}

void Widen16(DType wt, const uint8_t* group, const FloatChunkOrder& order, int64_t first_chunk,
             int64_t n_chunks, float* out, int64_t out_stride) {
  KVLLM_CHECK(wt == DType::kF16 || wt == DType::kBF16);
  const auto widen = wt == DType::kF16 ? &F16ToF32 : &BF16ToF32;
  for (int64_t c = 0; c < n_chunks; ++c) {
    const uint16_t* h = reinterpret_cast<const uint16_t*>(group) +
                        order.PositionOf(first_chunk + c) * 16 * kQK;
    for (int r = 0; r < 16; ++r, h += kQK) {
      for (int j = 0; j < kQK; ++j) out[r * out_stride + c * kQK + j] = widen(h[j]);
    }
  }
}

void DotActTile(const ActTileArgs& a) {
  for (int64_t t = 0; t < a.n_tok; ++t) {
    for (int r = 0; r < a.n_rows; ++r) {
      a.y[t * a.y_stride + r] = DotAct(a.wt, a.w + r * a.row_bytes, a.xq + t * a.xq_stride, a.n);
    }
  }
}

}  // namespace

const LevelKernels& ScalarLevelKernels() {
  static constexpr LevelKernels kLevel = {
      {SimdLevel::kScalar, &Dot, &Axpy, &Dequantize, &DotF32, &WeightedRows, &ExpSum,
       &MaxF32, &ScoresF16T, &ScoresQ8T, &QuantizeAct, &DotAct, &SwiGlu, &ToF16, 0},
      &DotTile,
      &DotRows,
      &DotActTile,
      &DotRows16,
      &Widen16,
      &DotAct16,
  };
  return kLevel;
}

}  // namespace kvllm::internal
