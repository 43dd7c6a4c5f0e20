// The per-token costs behind the roofline columns of `kvllm bench`: what one decode step
// reads from memory and what one prompt token costs in FLOPs, from the model's shapes and
// the KV formats only. The limits divide the machine's ceilings (tensor/roofline.h) by them:
//
//   decode  limit tokens/s = read bandwidth / (weight bytes + KV bytes per token x context)
//   prefill limit tokens/s = FMA peak / (matmul FLOPs + attention FLOPs at the prompt length)
#pragma once

#include <cstdint>

#include "kv/kv_layout.h"
#include "model/model.h"

namespace kvllm::cli {

struct TokenCosts {
  // Bytes one decode step reads besides the cache: every layer's seven matrices, the output
  // matrix, the norms (f32) and one row of the token embedding.
  double weight_bytes = 0;
  // K and V of one cached token over all layers and KV heads (KVLayout::bytes_per_token).
  double kv_bytes_per_token = 0;
  // Tokens attention can reach (the sliding window plus its sinks), 0 = unlimited.
  int64_t max_context = 0;
  // FLOPs of the layers' matrices for one token: 2 x their parameters.
  double layer_matmul_flops = 0;
  // FLOPs of the output matrix: paid once per prompt (only the last token's logits are kept).
  double output_flops = 0;
  // Attention FLOPs per (query token, attended token) pair: 4 x n_layer x n_head x head_dim
  // (q.k and the weighted sum of v, each a multiply and an add per element).
  double attention_flops_per_pair = 0;

  // Bytes read by a decode step that attends over `context` tokens.
  double DecodeBytes(double context) const;
  // Average FLOPs per token of a causal prefill of n_prompt tokens (token i attends over i+1).
  double PrefillFlopsPerToken(int64_t n_prompt) const;
};

TokenCosts ComputeTokenCosts(const Model& model, const KVLayout& layout, int32_t kv_window,
                             int32_t kv_sinks);

}  // namespace kvllm::cli
