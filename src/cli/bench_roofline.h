// The per-token costs behind the roofline columns of `kvllm bench`: what one decode step
// reads from memory and what one prompt token costs in FLOPs, from the model's shapes and
// the KV formats only. The limits divide the machine's ceilings (tensor/roofline.h) by them:
//
//   decode  limit tokens/s = read bandwidth / (weight bytes + KV bytes per token x context)
//   prefill limit tokens/s = 1 / (float FLOPs / FMA peak + 8-bit ops / 8-bit dot peak)
// where the 8-bit ops are the multiply-adds of Q8_0 and Q4_0 matrices (integer dots against
// 8-bit activations) and the float FLOPs the rest: other matrices and attention.
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
  // Operations of the layers' matrices for one token: 2 x their parameters, those of Q8_0 and
  // Q4_0 matrices as 8-bit ops, the others as float FLOPs.
  double layer_matmul_flops = 0;
  double layer_int8_ops = 0;
  // The same of the output matrix: paid once per prompt (only the last token's logits are
  // kept).
  double output_flops = 0;
  double output_int8_ops = 0;
  // Attention FLOPs per (query token, attended token) pair: 4 x n_layer x n_head x head_dim
  // (q.k and the weighted sum of v, each a multiply and an add per element).
  double attention_flops_per_pair = 0;
  // The share of those a decode step does as 8-bit ops: q.k (half) where the cache's K is
  // scored in integers (AttentionQuantizesQuery), else 0.
  double attention_int8_share = 0;
  // The share done as 16-bit multiply-adds: the weighted sum of v (half) where the cache's V
  // is summed in integers (AttentionWeighsVInIntegers), else 0. They run at half the 8-bit dot peak:
  // vpdpwssd does 32 products where vpdpbusd does 64.
  double attention_int16_share = 0;

  // Bytes read by a decode step that attends over `context` tokens.
  double DecodeBytes(double context) const;
  // The least time of such a step: the weights streamed at `bandwidth` (their matrices wait
  // for attention's output and attention for theirs, so the two add up), then attention,
  // bound by the larger of reading the cache and its arithmetic at the peaks (FLOP/s, 8-bit
  // op/s, 16-bit ops at half the latter; 0 counts as the FMA peak). Without peaks (0), the
  // bytes alone.
  double DecodeSeconds(double context, double bandwidth, double fma_peak,
                       double int8_peak) const;
  // Average operations (float and 8-bit) per token of a causal prefill of n_prompt tokens
  // (token i attends over i+1).
  double PrefillFlopsPerToken(int64_t n_prompt) const;
  // The 8-bit part of that.
  double PrefillInt8OpsPerToken(int64_t n_prompt) const;
  // Seconds per prompt token at the two peaks (ops/s; an 8-bit peak of 0 counts as the FMA
  // peak).
  double PrefillSecondsPerToken(int64_t n_prompt, double fma_peak, double int8_peak) const;
};

TokenCosts ComputeTokenCosts(const Model& model, const KVLayout& layout, int32_t kv_window,
                             int32_t kv_sinks);

}  // namespace kvllm::cli
