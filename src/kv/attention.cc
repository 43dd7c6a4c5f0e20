#include "kv/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "tensor/kernels.h"

namespace kvllm {

int64_t AttentionScratchFloats(int32_t n_group, int32_t block_size) {
  // scores [n_group][block_size] + running max and sum [2][n_group]
  return int64_t{n_group} * block_size + 2 * int64_t{n_group};
}

void AttendGroup(const AttentionArgs& a, float* out, float* scratch) {
  const KernelSet& k = Kernels();
  const KVLayout& lay = a.kv->layout();
  const int32_t bs = lay.block_size();
  const int32_t d = lay.shape().head_dim;
  const DType kt = lay.k_type(), vt = lay.v_type();
  float* scores = scratch;                             // [n_group][bs]
  float* run_max = scratch + int64_t{a.n_group} * bs;  // [n_group]
  float* run_sum = run_max + a.n_group;                // [n_group]
  std::fill(run_max, run_max + a.n_group, -std::numeric_limits<float>::infinity());
  std::fill(run_sum, run_sum + a.n_group, 0.0f);
  std::fill(out, out + int64_t{a.n_group} * d, 0.0f);

  for (int32_t sp = 0; sp < a.n_spans; ++sp) {
    const AttentionSpan& span = a.spans[sp];
    // Visit the span block by block: slots [idx, idx + n) lie in one block.
    for (int32_t idx = span.begin; idx < span.end;) {
      const int32_t slot0 = idx % bs;
      const int32_t n = std::min(bs - slot0, span.end - idx);
      const uint8_t* block = a.kv->BlockData(a.table->blocks[idx / bs]);
      for (int32_t j = 0; j < n; ++j) {
        const void* krow = block + lay.KRowOffset(a.layer, a.kv_head, slot0 + j);
        for (int32_t g = 0; g < a.n_group; ++g) {
          scores[g * bs + j] = k.dot(kt, krow, span.q + int64_t{g} * d, d) * a.scale;
        }
      }
      for (int32_t g = 0; g < a.n_group; ++g) {
        float* s = scores + g * bs;
        const float m_new = std::max(run_max[g], *std::max_element(s, s + n));
        const float correction = std::exp(run_max[g] - m_new);  // 0 on the first block
        float* acc = out + int64_t{g} * d;
        if (correction != 1.0f) {
          for (int32_t i = 0; i < d; ++i) acc[i] *= correction;
        }
        float sum = run_sum[g] * correction;
        for (int32_t j = 0; j < n; ++j) {
          s[j] = std::exp(s[j] - m_new);
          sum += s[j];
        }
        run_max[g] = m_new;
        run_sum[g] = sum;
      }
      for (int32_t j = 0; j < n; ++j) {
        const void* vrow = block + lay.VRowOffset(a.layer, a.kv_head, slot0 + j);
        for (int32_t g = 0; g < a.n_group; ++g) {
          k.axpy(vt, vrow, scores[g * bs + j], out + int64_t{g} * d, d);
        }
      }
      idx += n;
    }
  }
  for (int32_t g = 0; g < a.n_group; ++g) {
    const float inv = run_sum[g] > 0 ? 1.0f / run_sum[g] : 0.0f;
    float* acc = out + int64_t{g} * d;
    for (int32_t i = 0; i < d; ++i) acc[i] *= inv;
  }
}

void AttendGroup_ref(const AttentionArgs& a, float* out) {
  const KernelSet& ref = ReferenceKernels();
  const KVLayout& lay = a.kv->layout();
  const int32_t bs = lay.block_size();
  const int32_t d = lay.shape().head_dim;
  std::vector<float> row(d);
  for (int32_t g = 0; g < a.n_group; ++g) {
    std::vector<double> s;
    std::vector<int32_t> slots;
    for (int32_t sp = 0; sp < a.n_spans; ++sp) {
      const float* qg = a.spans[sp].q + int64_t{g} * d;
      for (int32_t j = a.spans[sp].begin; j < a.spans[sp].end; ++j) {
        const uint8_t* block = a.kv->BlockData(a.table->blocks[j / bs]);
        ref.dequantize(lay.k_type(), block + lay.KRowOffset(a.layer, a.kv_head, j % bs),
                       row.data(), d);
        double dot = 0;
        for (int32_t i = 0; i < d; ++i) dot += double{qg[i]} * row[i];
        s.push_back(dot * a.scale);
        slots.push_back(j);
      }
    }
    const double m = *std::max_element(s.begin(), s.end());
    double sum = 0;
    for (double& x : s) sum += (x = std::exp(x - m));
    std::vector<double> acc(d, 0.0);
    for (size_t j = 0; j < slots.size(); ++j) {
      const uint8_t* block = a.kv->BlockData(a.table->blocks[slots[j] / bs]);
      ref.dequantize(lay.v_type(), block + lay.VRowOffset(a.layer, a.kv_head, slots[j] % bs),
                     row.data(), d);
      for (int32_t i = 0; i < d; ++i) acc[i] += s[j] / sum * row[i];
    }
    for (int32_t i = 0; i < d; ++i) out[int64_t{g} * d + i] = static_cast<float>(acc[i]);
  }
}

}  // namespace kvllm
