// Paged attention for one query token over its sequence's cached K/V, read in place through
// the block table in whatever format the cache stores (no dequantized copy of the cache).
// Softmax is computed online, one block at a time (running max m, running sum l):
//
//   for each block:  s_j = q·k_j · scale        (every slot j of the block in range)
//                    m' = max(m, max_j s_j);  c = exp(m − m')
//                    l  = l·c + Σ_j exp(s_j − m');   acc = acc·c + Σ_j exp(s_j − m')·v_j
//   out = acc / l
#pragma once

#include <cstdint>

#include "kv/kv_cache.h"

namespace kvllm {

struct AttentionArgs {
  const KVCache* kv;
  const BlockTable* table;
  int32_t layer;
  int32_t kv_head;
  int32_t n_ctx;    // attends to cache slots [0, n_ctx)
  int32_t n_group;  // query heads sharing this KV head (GQA)
  float scale;      // usually 1/sqrt(head_dim)
};

// Number of floats of scratch AttendGroup needs.
int64_t AttentionScratchFloats(int32_t n_group, int32_t block_size, int32_t head_dim);

// q: [n_group][head_dim] the query heads of one KV head group; out: [n_group][head_dim].
// Each K row is read once for the whole group. `scratch` holds AttentionScratchFloats floats.
void AttendGroup(const AttentionArgs& args, const float* q, float* out, float* scratch);

// The same result computed the plain way (dequantize every row, full softmax): the oracle.
void AttendGroup_ref(const AttentionArgs& args, const float* q, float* out);

}  // namespace kvllm
