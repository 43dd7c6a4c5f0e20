// Paged attention for one query token over its sequence's cached K/V, read in place through
// the block table in whatever format the cache stores (no dequantized copy of the cache).
// Softmax is computed online, one block at a time (running max m, running sum l):
//
//   for each block:  s_j = q·k_j · scale        (every slot j of the block in range)
//                    m' = max(m, max_j s_j);  c = exp(m − m')
//                    l  = l·c + Σ_j exp(s_j − m');   acc = acc·c + Σ_j exp(s_j − m')·v_j
//   out = acc / l
//
// A query attends to one or two spans of cache slots, each with its own rotated query: the
// whole past normally; with a sliding window, the attention sinks and the window (see
// KVWindow), where the sinks are read with the query rotated so that they sit just before
// the window (StreamingLLM positions).
//
// Per chunk of blocks, the whole query group is scored against K (scores [n_group][n]); then
// the V rows are added with the probabilities as weights, read where they lie (f32, f16,
// bf16, q8_0; other formats are turned into floats in scratch first). Each row is read or
// converted once per query group, never once per query head. How K is read (kv_format.h):
//   row formats   s_j = k_j · q                       (k_j dequantized from its DType)
//   q8_0          s_j = Σ_b d_jb · q.d_b · (q.qs_b · codes_jb) over groups b of 32 dimensions:
//                 the query quantized to 8 bits once per span, as llama.cpp does for a q8_0
//                 K, so that each group's dot is an exact integer sum (VNNI)
//   q4_0r         the same with q rotated first (R q)·(R k_j) = q·k_j, once per span
//   KIVI, staged  s_j = k_j · q                       (f16 rows: the block the query sits in)
//   KIVI, sealed  s_j = Σ_d (q_d·scale_d)·code_jd + Σ_d q_d·min_d: q·scale and q·min once per
//                 block, against the block's codes unpacked into floats
// Scratch holds at most one block: no copy of the cache is made.
#pragma once

#include <atomic>
#include <cstdint>

#include "kv/kv_cache.h"

namespace kvllm {

struct AttentionSpan {
  int32_t begin;   // first cache slot
  int32_t end;     // one past the last
  const float* q;  // [n_group][head_dim] query heads, rotated for this span
};

struct AttentionArgs {
  const KVCache* kv;
  SeqId seq;
  int32_t layer;
  int32_t kv_head;
  int32_t n_group;  // query heads sharing this KV head (GQA)
  float scale;      // usually 1/sqrt(head_dim)
  AttentionSpan spans[2];
  int32_t n_spans;  // 1 or 2; spans are disjoint and not empty
};

// Whether the query is quantized to 8 bits to meet this K format, so that q.k is summed in
// integers (a dimension-major q8_0 K).
bool AttentionQuantizesQuery(KVFormat k_format);
// Whether V's weighted sum runs in integers for this V format (a q8_0 V read in place:
// kernels.h, weighted_rows).
bool AttentionWeighsVInIntegers(KVFormat v_format);

// Number of floats of scratch AttendGroup needs.
int64_t AttentionScratchFloats(const KVLayout& layout, int32_t n_group);

// out: [n_group][head_dim]. Each K and V row is read once for the whole group.
// `scratch` holds AttentionScratchFloats floats.
void AttendGroup(const AttentionArgs& args, float* out, float* scratch);

// Flash-decoding: at long context one query's slots are split into parts that different
// threads attend, each leaving its softmax unnormalised; merging them is exact up to rounding.
// A part is AttentionPartFloats floats: acc [n_group][head_dim] = Σ_j exp(s_j − max)·v_j,
// then max [n_group] and sum [n_group] = Σ_j exp(s_j − max). A part with no slot has max −inf,
// sum 0 and acc 0.
int64_t AttentionPartFloats(int32_t n_group, int32_t head_dim);
// The part of AttendGroup over the spans' slots inside [slot_begin, slot_end).
void AttendGroupPart(const AttentionArgs& args, int32_t slot_begin, int32_t slot_end,
                     float* part, float* scratch);
// out [n_group][head_dim] from n_parts parts.
void MergeAttentionParts(const float* const* parts, int32_t n_parts, int32_t n_group,
                         int32_t head_dim, float* out);

// The slots [next, limit) of a one-span query's attention that no thread has begun, while
// threads share it (AttentionSplit): the thread attending it takes them a chunk at a time
// (the chunks the streaming loop above visits, whole blocks of at least 256 slots), and a
// thread with nothing left to do may move the limit back and take what lies behind it. Both
// bounds live in one word, so each move is one compare-exchange.
class SlotClaim {
 public:
  void Set(int32_t next, int32_t limit);
  int32_t Next() const;
  int32_t Unclaimed() const;  // limit - next, 0 once all is taken
  // Takes the back half (in chunks; the front keeps the odd one) of what is unclaimed as
  // [*begin, *end), cut where the front's chunks end; false, and nothing taken, where fewer
  // than two chunks are left.
  bool TakeBackHalf(int32_t block_size, int32_t* begin, int32_t* end);
  // Takes the chunk [from, to) where from is the claim's next slot and before its limit.
  bool TakeChunk(int32_t from, int32_t to);

 private:
  std::atomic<uint64_t> word_{0};
};

// AttendGroupPart over the slots of the claim (at most the one span of `args`), each chunk
// taken from it before it is read, until it runs out.
void AttendGroupClaimed(const AttentionArgs& args, SlotClaim& claim, float* part,
                        float* scratch);

// The same result computed the plain way (every row dequantized with KVCache::ReadK/ReadV,
// the unrotated query, quantized and read back for a q8_0 K as the kernel sees it, full
// softmax in double): the oracle.
void AttendGroup_ref(const AttentionArgs& args, float* out);

}  // namespace kvllm
