#include "model/model.h"

#include <cmath>

#include "kv/attention.h"
#include "tensor/kernels.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

namespace kvllm {
namespace {

// y = x / sqrt(mean(x²) + eps) * w
void RmsNorm(const float* x, const float* w, float* y, int32_t n, float eps) {
  double ss = 0;
  for (int32_t i = 0; i < n; ++i) ss += double{x[i]} * x[i];
  const float scale = static_cast<float>(1.0 / std::sqrt(ss / n + eps));
  for (int32_t i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// Rotates adjacent pairs (x[2i], x[2i+1]) of the first n_rot dims of each head by
// pos * inv_freq[i] (GGUF Llama files store Q/K permuted for this "normal" RoPE layout).
void Rope(float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, int32_t pos,
          const float* inv_freq) {
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    const double theta = static_cast<double>(pos) * inv_freq[i];
    const float c = static_cast<float>(std::cos(theta)), s = static_cast<float>(std::sin(theta));
    for (int32_t h = 0; h < n_heads; ++h) {
      float* p = x + int64_t{h} * head_dim + 2 * i;
      const float x0 = p[0], x1 = p[1];
      p[0] = x0 * c - x1 * s;
      p[1] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path) {
  KVLLM_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::Open(path));
  KVLLM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromGguf(file));
  KVLLM_ASSIGN_OR_RETURN(Weights weights, Weights::Bind(file, config));
  return std::unique_ptr<Model>(new Model(std::move(file), std::move(config), std::move(weights)));
}

Model::Model(gguf::GgufFile file, ModelConfig config, Weights weights)
    : file_(std::move(file)), config_(std::move(config)), weights_(std::move(weights)) {
  inv_freq_.resize(config_.n_rot / 2);
  for (int32_t i = 0; i < config_.n_rot / 2; ++i) {
    inv_freq_[i] = static_cast<float>(std::pow(double{config_.rope_base}, -2.0 * i / config_.n_rot));
  }
}

void Model::EnsureScratch(int32_t n_tok, int32_t n_threads, int32_t block_size) {
  const ModelConfig& c = config_;
  if (n_tok > scratch_tokens_) {
    scratch_tokens_ = n_tok;
    const int64_t n = n_tok;
    x_.resize(n * c.n_embd);
    h_.resize(n * c.n_embd);
    q_.resize(n * c.n_head * c.head_dim);
    q_raw_.resize(n * c.n_head * c.head_dim);
    k_.resize(n * c.n_kv_head * c.head_dim);
    v_.resize(n * c.n_kv_head * c.head_dim);
    attn_.resize(n * c.n_head * c.head_dim);
    gate_.resize(n * c.n_ff);
    up_.resize(n * c.n_ff);
  }
  att_scratch_stride_ =
      AttentionScratchFloats(c.n_group(), block_size) + int64_t{c.n_group()} * c.head_dim;
  const size_t need = static_cast<size_t>(att_scratch_stride_) * n_threads;
  if (att_scratch_.size() < need) att_scratch_.resize(need);
}

void Model::Forward(const ForwardBatch& batch, KVCache& kv, ThreadPool& pool, float* logits) {
  const ModelConfig& c = config_;
  const int32_t n_tok = batch.size();
  if (n_tok == 0) return;
  EnsureScratch(n_tok, pool.size(), kv.block_size());
  const int64_t e = c.n_embd, qd = int64_t{c.n_head} * c.head_dim,
                kvd = int64_t{c.n_kv_head} * c.head_dim;
  const KernelSet& kern = Kernels();

  for (int32_t t = 0; t < n_tok; ++t) {
    KVLLM_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < c.n_vocab);
    kern.dequantize(weights_.token_embd.type, weights_.token_embd.Row(batch.tokens[t]),
                    &x_[t * e], e);
  }

  const KVLayout& lay = kv.layout();
  for (int32_t layer = 0; layer < c.n_layer; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    // Attention block: h = norm(x); q, k, v = h W; rope; cache k, v; attend; x += attn Wo.
    for (int32_t t = 0; t < n_tok; ++t) RmsNorm(&x_[t * e], w.attn_norm, &h_[t * e], e, c.rms_eps);
    MatMul(w.wq.type, w.wq.data, qd, e, h_.data(), n_tok, q_.data(), &pool);
    MatMul(w.wk.type, w.wk.data, kvd, e, h_.data(), n_tok, k_.data(), &pool);
    MatMul(w.wv.type, w.wv.data, kvd, e, h_.data(), n_tok, v_.data(), &pool);
    if (kv.window().enabled()) std::copy(q_.begin(), q_.begin() + n_tok * qd, q_raw_.begin());
    for (int32_t t = 0; t < n_tok; ++t) {
      const int32_t pos = batch.positions[t];
      Rope(&q_[t * qd], c.n_head, c.head_dim, c.n_rot, pos, inv_freq_.data());
      Rope(&k_[t * kvd], c.n_kv_head, c.head_dim, c.n_rot, pos, inv_freq_.data());
      const BlockTable& table = kv.Table(batch.seq_ids[t]);
      KVLLM_CHECK(pos < table.num_tokens);
      for (int32_t h = 0; h < c.n_kv_head; ++h) {
        const int64_t off = t * kvd + int64_t{h} * c.head_dim;
        QuantizeRow(lay.k_type(), &k_[off], kv.KRow(table, layer, h, pos), c.head_dim);
        QuantizeRow(lay.v_type(), &v_[off], kv.VRow(table, layer, h, pos), c.head_dim);
      }
    }
    Attention(batch, kv, pool, layer);
    MatMul(w.wo.type, w.wo.data, e, qd, attn_.data(), n_tok, h_.data(), &pool);
    for (int64_t i = 0; i < n_tok * e; ++i) x_[i] += h_[i];

    // Feed-forward block: x += (silu(h Wgate) * (h Wup)) Wdown.
    for (int32_t t = 0; t < n_tok; ++t) RmsNorm(&x_[t * e], w.ffn_norm, &h_[t * e], e, c.rms_eps);
    MatMul(w.w_gate.type, w.w_gate.data, c.n_ff, e, h_.data(), n_tok, gate_.data(), &pool);
    MatMul(w.w_up.type, w.w_up.data, c.n_ff, e, h_.data(), n_tok, up_.data(), &pool);
    for (int64_t i = 0; i < int64_t{n_tok} * c.n_ff; ++i) {
      const float g = gate_[i];
      gate_[i] = g / (1.0f + std::exp(-g)) * up_[i];
    }
    MatMul(w.w_down.type, w.w_down.data, e, c.n_ff, gate_.data(), n_tok, h_.data(), &pool);
    for (int64_t i = 0; i < n_tok * e; ++i) x_[i] += h_[i];
  }

  // Only the requested rows reach the (large) output matrix.
  const int32_t n_out = static_cast<int32_t>(batch.logit_rows.size());
  for (int32_t r = 0; r < n_out; ++r) {
    const int32_t t = batch.logit_rows[r];
    RmsNorm(&x_[t * e], weights_.output_norm, &h_[r * e], e, c.rms_eps);
  }
  MatMul(weights_.output.type, weights_.output.data, c.n_vocab, e, h_.data(), n_out, logits,
         &pool);
}

void Model::Attention(const ForwardBatch& batch, KVCache& kv, ThreadPool& pool, int32_t layer) {
  const ModelConfig& c = config_;
  const int32_t n_group = c.n_group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int64_t qd = int64_t{c.n_head} * c.head_dim;
  const KVWindow& window = kv.window();
  // One task per (token, kv head): it reads that head's K/V once for its query-head group.
  pool.ParallelFor(int64_t{batch.size()} * c.n_kv_head, [&](int64_t task, int thread) {
    const int32_t t = static_cast<int32_t>(task / c.n_kv_head);
    const int32_t h = static_cast<int32_t>(task % c.n_kv_head);
    const int32_t pos = batch.positions[t];
    const int64_t off = t * qd + int64_t{h} * n_group * c.head_dim;
    float* scratch = &att_scratch_[thread * att_scratch_stride_];
    AttentionArgs args{&kv, &kv.Table(batch.seq_ids[t]), layer, h, n_group, scale,
                       {{0, pos + 1, &q_[off]}}, 1};
    const int32_t begin = window.WindowBegin(pos);
    if (begin > 0) {
      // The window keeps its true distances to the query; the sinks are read with the query
      // rotated to the position it has when they sit just before the window.
      args.spans[0] = {begin, pos + 1, &q_[off]};
      args.n_spans = 1;
      if (window.sinks > 0) {
        float* q_sink = scratch + AttentionScratchFloats(n_group, kv.block_size());
        std::copy(&q_raw_[off], &q_raw_[off] + int64_t{n_group} * c.head_dim, q_sink);
        Rope(q_sink, n_group, c.head_dim, c.n_rot, pos - begin + window.sinks, inv_freq_.data());
        args.spans[1] = {0, window.sinks, q_sink};
        args.n_spans = 2;
      }
    }
    AttendGroup(args, &attn_[off], scratch);
  });
}

}  // namespace kvllm
