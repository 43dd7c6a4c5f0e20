#include "model/model.h"

#include <algorithm>
#include <cmath>

#include "kv/attention.h"
#include "tensor/kernels.h"
#include "tensor/thread_pool.h"

namespace kvllm {
namespace {

// Flash-decoding cuts a context only into parts of at least this many slots: below that the
// merge and the extra tasks cost more than the idle threads they fill.
constexpr int32_t kMinSlotsPerAttentionPart = 256;

// Attention of up to this many (token, KV head) pairs a thread is shared through
// AttentionSplit (decode, and batches of a few sequences); larger batches are balanced well
// enough by the pool's tasks, a token each.
constexpr int32_t kSplitPairsPerThread = 16;

// y = x / sqrt(mean(x²) + eps) * w
void RmsNorm(const float* x, const float* w, float* y, int32_t n, float eps) {
  // Eight independent sums: one chain of n dependent adds waited an add's latency per element.
  constexpr int kSums = 8;
  double ss[kSums] = {};
  int32_t i = 0;
  for (; i + kSums <= n; i += kSums) {
    for (int k = 0; k < kSums; ++k) ss[k] += double{x[i + k]} * x[i + k];
  }
  for (; i < n; ++i) ss[0] += double{x[i]} * x[i];
  double sum = 0;
  for (double s : ss) sum += s;
  const float scale = static_cast<float>(1.0 / std::sqrt(sum / n + eps));
  for (i = 0; i < n; ++i) y[i] = x[i] * scale * w[i];
}

// Asks for a norm's weights (n floats) to be brought into the L2 cache. Called before the
// matmul that precedes the norm: after a token's stream of weights they are in no cache, and
// read cold in the norm they cost about 2 us of each norm's 3-5 us, with both threads idle.
void RequestNormWeights(const float* w, int64_t n) {
  for (int64_t i = 0; i < n; i += 64 / sizeof(float)) __builtin_prefetch(w + i, 0, 2);
}

// The cosines and sines of pos * inv_freq[i], i < n_rot / 2, as cs[2i], cs[2i + 1].
void RopeAngles(int32_t pos, const float* inv_freq, int32_t n_rot, float* cs) {
  for (int32_t i = 0; i < n_rot / 2; ++i) {
    const double theta = static_cast<double>(pos) * inv_freq[i];
    cs[2 * i] = static_cast<float>(std::cos(theta));
    cs[2 * i + 1] = static_cast<float>(std::sin(theta));
  }
}

// Rotates adjacent pairs (x[2i], x[2i+1]) of the first n_rot dims of each head by the angle
// of cs (RopeAngles; GGUF Llama files store Q/K permuted for this "normal" RoPE layout).
void Rope(float* x, int32_t n_heads, int32_t head_dim, int32_t n_rot, const float* cs) {
  for (int32_t h = 0; h < n_heads; ++h) {
    float* p = x + int64_t{h} * head_dim;
    for (int32_t i = 0; i < n_rot; i += 2) {
      const float c = cs[i], s = cs[i + 1], x0 = p[i], x1 = p[i + 1];
      p[i] = x0 * c - x1 * s;
      p[i + 1] = x0 * s + x1 * c;
    }
  }
}

}  // namespace

StatusOr<std::unique_ptr<Model>> Model::Load(const std::string& path,
                                             const ModelLoadOptions& options) {
  KVLLM_ASSIGN_OR_RETURN(gguf::GgufFile file, gguf::GgufFile::Open(path, options.mode));
  KVLLM_ASSIGN_OR_RETURN(ModelConfig config, ModelConfig::FromGguf(file));
  KVLLM_ASSIGN_OR_RETURN(Weights weights, Weights::Bind(file, config));
  if (options.repack) KVLLM_RETURN_IF_ERROR(weights.Interleave(file));
  return std::unique_ptr<Model>(new Model(std::move(file), std::move(config), std::move(weights)));
}

Model::Model(gguf::GgufFile file, ModelConfig config, Weights weights)
    : file_(std::move(file)), config_(std::move(config)), weights_(std::move(weights)) {
  identity_ = HashBytes(file_.header());
  inv_freq_.resize(config_.n_rot / 2);
  for (int32_t i = 0; i < config_.n_rot / 2; ++i) {
    inv_freq_[i] =
        static_cast<float>(std::pow(double{config_.rope_base}, -2.0 * i / config_.n_rot));
  }
}

void Model::EnsureScratch(int32_t n_tok, int32_t n_threads, const KVLayout& layout) {
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
    rope_cs_.resize(n * c.n_rot);
  }
  // Each thread's scratch, then its sinks' query and their angles, rounded up to whole cache
  // lines and one line apart, so that no line is written by two threads.
  att_scratch_stride_ = (AttentionScratchFloats(layout, c.n_group()) +
                         int64_t{c.n_group()} * c.head_dim + c.n_rot + 15) /
                            16 * 16 +
                        16;
  const size_t need = static_cast<size_t>(att_scratch_stride_) * n_threads;
  if (att_scratch_.size() < need) att_scratch_.resize(need);
  // AttentionParts splits only while (token, kv head) pairs < 2 * threads, into at most
  // ceil(2 * threads / pairs) parts each: fewer than 4 * threads parts in all.
  const size_t parts = static_cast<size_t>(AttentionPartFloats(c.n_group(), c.head_dim)) * 4 *
                       static_cast<size_t>(n_threads);
  if (att_parts_.size() < parts) att_parts_.resize(parts);
  att_part_ptrs_.resize(std::max<size_t>(att_part_ptrs_.size(), 4 * n_threads));
  att_split_.Reserve(kSplitPairsPerThread * n_threads, n_threads, c.n_group(), c.head_dim);
}

void Model::PlanPhases(const ForwardBatch& batch, int32_t block_size, bool staged_k) {
  const int32_t n_tok = batch.size();
  row_phase_.assign(n_tok, 0);
  if (staged_k) {
    first_block_.clear();
    for (int32_t t = 0; t < n_tok; ++t) {
      const int32_t b = batch.positions[t] / block_size;
      auto it = std::find_if(first_block_.begin(), first_block_.end(),
                             [&](const auto& e) { return e.first == batch.seq_ids[t]; });
      if (it == first_block_.end()) {
        first_block_.emplace_back(batch.seq_ids[t], b);
      } else {
        it->second = std::min(it->second, b);
      }
    }
    for (int32_t t = 0; t < n_tok; ++t) {
      auto it = std::find_if(first_block_.begin(), first_block_.end(),
                             [&](const auto& e) { return e.first == batch.seq_ids[t]; });
      row_phase_[t] = batch.positions[t] / block_size - it->second;
    }
  }
  // Counting sort of the rows by phase, keeping batch order within a phase. phase_begin_[p]
  // serves as phase p's fill cursor, which leaves it at the next phase's start; the final
  // shift puts every start back.
  const int32_t n_phases = *std::max_element(row_phase_.begin(), row_phase_.end()) + 1;
  phase_begin_.assign(n_phases + 1, 0);
  for (int32_t p : row_phase_) ++phase_begin_[p + 1];
  for (int32_t p = 0; p < n_phases; ++p) phase_begin_[p + 1] += phase_begin_[p];
  phase_rows_.resize(n_tok);
  for (int32_t t = 0; t < n_tok; ++t) phase_rows_[phase_begin_[row_phase_[t]]++] = t;
  for (int32_t p = n_phases; p > 0; --p) phase_begin_[p] = phase_begin_[p - 1];
  phase_begin_[0] = 0;
}

void Model::Forward(const ForwardBatch& batch, KVCache& kv, ThreadPool& pool, float* logits) {
  const ModelConfig& c = config_;
  const int32_t n_tok = batch.size();
  if (n_tok == 0) return;
  const KVLayout& lay = kv.layout();
  const bool staged_k = lay.k_format().staged(KVRole::kK);
  EnsureScratch(n_tok, pool.size(), lay);
  PlanPhases(batch, lay.block_size(), staged_k);
  const int64_t e = c.n_embd, qd = int64_t{c.n_head} * c.head_dim,
                kvd = int64_t{c.n_kv_head} * c.head_dim;
  const KernelSet& kern = Kernels();

  for (int32_t t = 0; t < n_tok; ++t) {
    KVLLM_CHECK(batch.tokens[t] >= 0 && batch.tokens[t] < c.n_vocab);
    kern.dequantize(weights_.token_embd.type, weights_.token_embd.Row(batch.tokens[t]),
                    &x_[t * e], e);
    // Once per token for all layers (each layer computed them twice, for q and k).
    RopeAngles(batch.positions[t], inv_freq_.data(), c.n_rot, &rope_cs_[int64_t{t} * c.n_rot]);
  }

  for (int32_t layer = 0; layer < c.n_layer; ++layer) {
    const LayerWeights& w = weights_.layers[layer];
    // Attention block: h = norm(x); q, k, v = h W; rope; cache v; then phase by phase (see
    // model.h) cache k, attend, seal full KIVI K blocks; x += attn Wo.
    for (int32_t t = 0; t < n_tok; ++t) RmsNorm(&x_[t * e], w.attn_norm, &h_[t * e], e, c.rms_eps);
    const MatMulOut qkv[] = {w.wq.Product(q_.data()), w.wk.Product(k_.data()),
                             w.wv.Product(v_.data())};
    MatMulShared(qkv, e, h_.data(), n_tok, &pool);
    if (kv.window().enabled()) std::copy(q_.begin(), q_.begin() + n_tok * qd, q_raw_.begin());
    for (int32_t t = 0; t < n_tok; ++t) {
      const float* cs = &rope_cs_[int64_t{t} * c.n_rot];
      Rope(&q_[t * qd], c.n_head, c.head_dim, c.n_rot, cs);
      Rope(&k_[t * kvd], c.n_kv_head, c.head_dim, c.n_rot, cs);
      kv.WriteV(batch.seq_ids[t], layer, batch.positions[t], &v_[t * kvd]);
    }
    for (size_t p = 0; p + 1 < phase_begin_.size(); ++p) {
      const int32_t* rows = &phase_rows_[phase_begin_[p]];
      const int32_t n_rows = phase_begin_[p + 1] - phase_begin_[p];
      for (int32_t i = 0; i < n_rows; ++i) {
        kv.WriteK(batch.seq_ids[rows[i]], layer, batch.positions[rows[i]], &k_[rows[i] * kvd]);
      }
      Attention(batch, kv, pool, layer, rows, n_rows);
      for (int32_t i = 0; i < n_rows; ++i) {
        if (staged_k && (batch.positions[rows[i]] + 1) % lay.block_size() == 0) {
          kv.SealK(batch.seq_ids[rows[i]], layer);
        }
      }
    }
    RequestNormWeights(w.ffn_norm, e);
    MatMul(w.wo.type, w.wo.data, e, qd, attn_.data(), n_tok, h_.data(), &pool, w.wo.layout);
    for (int64_t i = 0; i < n_tok * e; ++i) x_[i] += h_[i];

    // Feed-forward block: x += (silu(h Wgate) * (h Wup)) Wdown.
    for (int32_t t = 0; t < n_tok; ++t) RmsNorm(&x_[t * e], w.ffn_norm, &h_[t * e], e, c.rms_eps);
    const MatMulOut gate_up[] = {w.w_gate.Product(gate_.data()), w.w_up.Product(up_.data())};
    MatMulShared(gate_up, e, h_.data(), n_tok, &pool);
    kern.swiglu(gate_.data(), up_.data(), int64_t{n_tok} * c.n_ff);
    RequestNormWeights(
        layer + 1 < c.n_layer ? weights_.layers[layer + 1].attn_norm : weights_.output_norm, e);
    MatMul(w.w_down.type, w.w_down.data, e, c.n_ff, gate_.data(), n_tok, h_.data(), &pool,
           w.w_down.layout);
    for (int64_t i = 0; i < n_tok * e; ++i) x_[i] += h_[i];
  }

  // Only the requested rows reach the (large) output matrix.
  const int32_t n_out = static_cast<int32_t>(batch.logit_rows.size());
  for (int32_t r = 0; r < n_out; ++r) {
    const int32_t t = batch.logit_rows[r];
    RmsNorm(&x_[t * e], weights_.output_norm, &h_[r * e], e, c.rms_eps);
  }
  MatMul(weights_.output.type, weights_.output.data, c.n_vocab, e, h_.data(), n_out, logits,
         &pool, weights_.output.layout);
}

void Model::Attention(const ForwardBatch& batch, KVCache& kv, ThreadPool& pool, int32_t layer,
                      const int32_t* rows, int32_t n_rows) {
  const ModelConfig& c = config_;
  const int32_t n_group = c.n_group();
  const float scale = 1.0f / std::sqrt(static_cast<float>(c.head_dim));
  const int64_t qd = int64_t{c.n_head} * c.head_dim;
  const KVWindow& window = kv.window();
  // The arguments of the attention of batch row t, KV head h; q_sink is scratch for the
  // sinks' query.
  auto make_args = [&](int32_t t, int32_t h, float* q_sink) {
    const int32_t pos = batch.positions[t];
    const int64_t off = t * qd + int64_t{h} * n_group * c.head_dim;
    AttentionArgs args{&kv, batch.seq_ids[t], layer, h, n_group, scale, {{0, pos + 1, &q_[off]}},
                       1};
    const int32_t begin = window.WindowBegin(pos);
    if (begin > 0) {
      // The window keeps its true distances to the query; the sinks are read with the query
      // rotated to the position it has when they sit just before the window.
      args.spans[0] = {begin, pos + 1, &q_[off]};
      args.n_spans = 1;
      if (window.sinks > 0) {
        std::copy(&q_raw_[off], &q_raw_[off] + int64_t{n_group} * c.head_dim, q_sink);
        float* cs = q_sink + int64_t{n_group} * c.head_dim;
        RopeAngles(pos - begin + window.sinks, inv_freq_.data(), c.n_rot, cs);
        Rope(q_sink, n_group, c.head_dim, c.n_rot, cs);
        args.spans[1] = {0, window.sinks, q_sink};
        args.n_spans = 2;
      }
    }
    return args;
  };
  const int64_t n_heads = int64_t{n_rows} * c.n_kv_head;
  const int64_t scratch_floats = AttentionScratchFloats(kv.layout(), n_group);
  bool two_spans = false;
  for (int32_t i = 0; i < n_rows; ++i) {
    two_spans |= window.sinks > 0 && window.WindowBegin(batch.positions[rows[i]]) > 0;
  }
  if (!two_spans && n_heads <= int64_t{kSplitPairsPerThread} * pool.size()) {
    att_split_.Run(
        pool, static_cast<int32_t>(n_heads),
        [&](int32_t pair, int thread) {
          return make_args(rows[pair / c.n_kv_head], pair % c.n_kv_head,
                           &att_scratch_[thread * att_scratch_stride_ + scratch_floats]);
        },
        [&](int32_t pair) {
          return &attn_[rows[pair / c.n_kv_head] * qd +
                        int64_t{pair % c.n_kv_head} * n_group * c.head_dim];
        },
        att_scratch_.data(), att_scratch_stride_);
    return;
  }
  const int32_t n_parts = AttentionParts(batch, rows, n_rows, pool.size());
  if (n_parts == 1) {
    // A task is one token's run of consecutive KV heads, each read once for its query-head
    // group: a token's heads are cut into as many runs as it takes to give every thread a
    // task, and no more, so that each thread streams through its heads' regions of the pool
    // (KVCache::KHead) with one hand-off per run.
    const int32_t runs = static_cast<int32_t>(std::clamp<int64_t>(
        (pool.size() + n_rows - 1) / n_rows, 1, c.n_kv_head));
    const int32_t run_heads = (c.n_kv_head + runs - 1) / runs;
    pool.ParallelFor(int64_t{n_rows} * runs, [&](int64_t task, int thread) {
      const int32_t t = rows[task / runs];
      const int32_t h0 = static_cast<int32_t>(task % runs) * run_heads;
      float* scratch = &att_scratch_[thread * att_scratch_stride_];
      for (int32_t h = h0; h < std::min(h0 + run_heads, c.n_kv_head); ++h) {
        AttendGroup(make_args(t, h, scratch + scratch_floats),
                    &attn_[t * qd + int64_t{h} * n_group * c.head_dim], scratch);
      }
    });
    return;
  }
  // Flash-decoding: too few (token, kv head) pairs to keep every thread busy, so each one's
  // slots are cut into n_parts block-aligned ranges attended in parallel, then merged.
  const int64_t part_floats = AttentionPartFloats(n_group, c.head_dim);
  const int32_t bs = kv.layout().block_size();
  pool.ParallelFor(n_heads * n_parts, [&](int64_t task, int thread) {
    const int64_t head = task / n_parts;
    const int32_t part = static_cast<int32_t>(task % n_parts);
    const int32_t t = rows[head / c.n_kv_head];
    const int32_t h = static_cast<int32_t>(head % c.n_kv_head);
    const int32_t blocks = (batch.positions[t] + bs) / bs;
    const int32_t part_blocks = (blocks + n_parts - 1) / n_parts;
    float* scratch = &att_scratch_[thread * att_scratch_stride_];
    AttendGroupPart(make_args(t, h, scratch + scratch_floats), part * part_blocks * bs,
                    (part + 1) * part_blocks * bs, &att_parts_[task * part_floats], scratch);
  });
  const float** parts = att_part_ptrs_.data();
  for (int64_t head = 0; head < n_heads; ++head) {
    const int32_t t = rows[head / c.n_kv_head];
    const int32_t h = static_cast<int32_t>(head % c.n_kv_head);
    for (int32_t p = 0; p < n_parts; ++p) {
      parts[p] = &att_parts_[(head * n_parts + p) * part_floats];
    }
    MergeAttentionParts(parts, n_parts, n_group, c.head_dim,
                        &attn_[t * qd + int64_t{h} * n_group * c.head_dim]);
  }
}

int32_t Model::AttentionParts(const ForwardBatch& batch, const int32_t* rows, int32_t n_rows,
                              int32_t n_threads) const {
  const int64_t n_heads = int64_t{n_rows} * config_.n_kv_head;
  if (n_heads >= 2 * int64_t{n_threads}) return 1;
  int32_t longest = 0;
  for (int32_t i = 0; i < n_rows; ++i) longest = std::max(longest, batch.positions[rows[i]] + 1);
  const int64_t by_threads = (2 * int64_t{n_threads} + n_heads - 1) / n_heads;
  const int64_t by_length = std::max<int64_t>(1, longest / kMinSlotsPerAttentionPart);
  return static_cast<int32_t>(std::min(by_threads, by_length));
}

}  // namespace kvllm
