// Model: a Llama-family decoder bound to a GGUF file, and its forward pass over a flat batch.
//
// The batch may mix tokens of several sequences and any number of tokens per sequence: a
// prompt's prefill is one batch (one matrix x matrix pass per weight), a decode step is one
// token per sequence. Each token's K and V are written into its sequence's cache slot
// `positions[i]` before attention reads slots [0, positions[i]] of that sequence (or its sinks
// and window, see KVWindow), so a batch of consecutive tokens attends causally among itself
// and to what was cached before.
//
// With a KIVI K (kv_format.h) a block's K is quantized once the block is full, from all of
// its tokens; a query inside the block reads it in f16 instead. So that a prefill sees exactly
// what token-by-token decoding would, each layer's attention then runs in phases, one block
// of each sequence at a time: write that block's K, attend its queries, seal it if full.
//
//   tokens of a sequence in the batch:  [.. block b ..][.. block b+1 ..][.. b+2 ..]
//   phase:                                     0              1            2
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "kv/attention_split.h"
#include "kv/ids.h"
#include "kv/kv_cache.h"
#include "model/model_config.h"
#include "model/weights.h"

namespace kvllm {

class ThreadPool;

struct ForwardBatch {
  std::vector<int32_t> tokens;      // [n_tokens]
  std::vector<int32_t> positions;   // [n_tokens] position = index of the token's cache slot
  std::vector<SeqId> seq_ids;       // [n_tokens]
  std::vector<int32_t> logit_rows;  // batch rows whose logits are returned, in output order

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }
  void Clear() {
    tokens.clear();
    positions.clear();
    seq_ids.clear();
    logit_rows.clear();
  }
  void Add(int32_t token, int32_t pos, SeqId seq, bool want_logits) {
    if (want_logits) logit_rows.push_back(size());
    tokens.push_back(token);
    positions.push_back(pos);
    seq_ids.push_back(seq);
  }
};

// How Model::Load makes the weights ready.
struct ModelLoadOptions {
  gguf::LoadMode mode = gguf::LoadMode::kMmap;
  // Copy the Q8_0, Q4_0, F16 and BF16 matrices the kernels multiply faster interleaved, 16 rows
  // at a time (Weights::Interleave); false keeps every weight in the file's rows (llama.cpp's
  // --no-repack).
  bool repack = true;
};

class Model {
 public:
  // Maps (kMmap) or reads (kRead) the file, binds the weights in place and, with `repack`,
  // interleaves the matrices that gain from it.
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                               const ModelLoadOptions& options);
  static StatusOr<std::unique_ptr<Model>> Load(const std::string& path,
                                               gguf::LoadMode mode = gguf::LoadMode::kMmap) {
    return Load(path, ModelLoadOptions{.mode = mode});
  }

  const ModelConfig& config() const { return config_; }
  const Weights& weights() const { return weights_; }
  const gguf::GgufFile& file() const { return file_; }
  // Hash of the file's metadata and tensor layout: K/V computed by models with different
  // identities are never mixed (prefix cache, stored KV).
  uint64_t identity() const { return identity_; }
  KVShape kv_shape() const { return KVShape{config_.n_layer, config_.n_kv_head, config_.head_dim}; }

  // Runs the batch: every token's cache slot must already be reserved in `kv` (its sequence
  // holds more than `positions[i]` slots) and every token id must be < n_vocab.
  // logits: [batch.logit_rows.size()][n_vocab].
  // Scratch buffers grow to the largest batch seen and are then reused.
  void Forward(const ForwardBatch& batch, KVCache& kv, ThreadPool& pool, float* logits);

 private:
  Model(gguf::GgufFile file, ModelConfig config, Weights weights);
  void EnsureScratch(int32_t n_tok, int32_t n_threads, const KVLayout& layout);
  // Groups the batch rows into phases (see the top of this file): one phase unless K is staged.
  void PlanPhases(const ForwardBatch& batch, int32_t block_size, bool staged_k);
  // Attention of the batch rows rows[0, n_rows) in one layer.
  void Attention(const ForwardBatch& batch, KVCache& kv, ThreadPool& pool, int32_t layer,
                 const int32_t* rows, int32_t n_rows);
  // How many parts each row's context is cut into for flash-decoding (1: not cut), where
  // the rows attend sinks and a window (two spans, which AttentionSplit does not cut).
  int32_t AttentionParts(const ForwardBatch& batch, const int32_t* rows, int32_t n_rows,
                         int32_t n_threads) const;

  gguf::GgufFile file_;
  ModelConfig config_;
  uint64_t identity_ = 0;
  Weights weights_;
  std::vector<float> inv_freq_;  // [n_rot/2] RoPE frequencies

  // Scratch, sized for the largest batch so far.
  int32_t scratch_tokens_ = 0;
  std::vector<float> x_;       // [n_tok][n_embd] residual stream
  std::vector<float> h_;       // [n_tok][n_embd] normed input of a sub-layer
  std::vector<float> q_;       // [n_tok][n_head][head_dim]
  std::vector<float> q_raw_;   // [n_tok][n_head][head_dim] before RoPE (sliding window only)
  std::vector<float> k_;       // [n_tok][n_kv_head][head_dim]
  std::vector<float> v_;       // [n_tok][n_kv_head][head_dim]
  std::vector<float> attn_;    // [n_tok][n_head][head_dim]
  std::vector<float> gate_;    // [n_tok][n_ff]
  std::vector<float> up_;      // [n_tok][n_ff]
  std::vector<float> rope_cs_;  // [n_tok][n_rot] each token's RoPE cosines and sines
  // [n_threads][AttentionScratchFloats + n_group * head_dim + n_rot]
  std::vector<float> att_scratch_;
  int64_t att_scratch_stride_ = 0;
  std::vector<float> att_parts_;  // flash-decoding parts, AttentionPartFloats each
  std::vector<const float*> att_part_ptrs_;  // [4 * n_threads] one head's parts, to merge
  AttentionSplit att_split_;
  // Phases of the current batch: rows of phase p are phase_rows_[phase_begin_[p], [p + 1]).
  std::vector<int32_t> phase_rows_;   // [n_tok] batch rows, grouped by phase
  std::vector<int32_t> phase_begin_;  // [n_phases + 1]
  std::vector<int32_t> row_phase_;    // [n_tok]
  std::vector<std::pair<SeqId, int32_t>> first_block_;  // [n_seqs] first block in the batch
};

}  // namespace kvllm
