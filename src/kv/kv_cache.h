// KVCache: the paged KV memory of all sequences. Physical memory is one buffer of
// num_blocks blocks (layout in kv_layout.h); each sequence owns a BlockTable mapping its
// logical blocks to physical ones. A sequence with a single contiguous cache is just a table.
//
//   sequence tokens:  [0 ........ S-1][S ....... 2S-1][2S .. n-1]
//   block table:       logical 0 ──▶ 7  logical 1 ──▶ 2  logical 2 ──▶ 5 (partly filled)
//
// Growth is plan-then-commit: CanAppend() changes nothing, Append() cannot fail.
//
// K and V are written through WriteK / WriteV, which quantize into the sequence's block. A
// KIVI K (kv_format.h) cannot be quantized one token at a time: the block being filled keeps
// its K in f16 in the sequence's staging area, one block per layer, until SealK quantizes it:
//
//   sequence tokens:  [0 ....... S-1][S ...... 2S-1][2S .. n-1]
//   K of a layer:      quantized       quantized      staging (f16), sealed once full
//
// Not thread-safe for mutation; concurrent readers of rows (attention) are fine while no
// mutation runs.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/ids.h"
#include "kv/kv_layout.h"

namespace kvllm {

struct BlockTable {
  // logical block i → physical block; an invalid id marks a block a sliding window released
  std::vector<BlockId> blocks;
  int32_t num_tokens = 0;  // token positions so far; the last block may be partly filled
};

// Sliding window with attention sinks (StreamingLLM, Xiao et al. 2023): a query at position p
// attends to the first `sinks` positions and the last `window` ones, [p + 1 - window, p].
// Blocks wholly between the two are released as generation proceeds, so memory stays flat:
// a sequence holds at most ceil(sinks / block_size) + ceil(window / block_size) + 1 blocks.
// The sinks are read as if they sat just before the window (positions within the cache), so
// no query ever sees a distance longer than sinks + window.
struct KVWindow {
  int32_t window = 0;  // 0: off, attend to everything
  int32_t sinks = 0;

  bool enabled() const { return window > 0; }
  // First position of the window for a query at `pos`; sinks are a separate span only when
  // this is past them (otherwise the query simply attends to [0, pos]).
  int32_t WindowBegin(int32_t pos) const {
    return enabled() && pos + 1 - window > sinks ? pos + 1 - window : 0;
  }
};

struct KVStats {
  size_t bytes_per_token = 0;  // in the pool, see KVLayout::bytes_per_token
  size_t bytes_per_block = 0;
  int32_t block_size = 0;
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;
  int64_t tokens_stored = 0;  // token slots held, over all sequences
  size_t bytes_allocated = 0; // the whole pool
  size_t bytes_used = 0;      // blocks_used × bytes_per_block
  // Outside the pool: the f16 staging of a KIVI K, per live sequence and in all.
  size_t staging_bytes_per_sequence = 0;
  size_t staging_bytes = 0;
  // Slots allocated but holding no token, over all allocated slots (0 when nothing is used).
  double fragmentation = 0;
};

class KVCache {
 public:
  KVCache(KVLayout layout, int32_t num_blocks, KVWindow window = {});
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  const KVLayout& layout() const { return layout_; }
  const KVWindow& window() const { return window_; }
  int32_t block_size() const { return layout_.block_size(); }
  int32_t num_blocks() const { return pool_.num_blocks(); }
  // Token capacity of the whole pool.
  int64_t capacity_tokens() const { return int64_t{num_blocks()} * block_size(); }

  // Blocks a sequence needs to hold `n_new` more tokens (0 for an unknown sequence with n 0).
  int32_t BlocksNeeded(SeqId seq, int32_t n_new) const;
  bool CanAppend(SeqId seq, int32_t n_new) const;
  // Grows `seq` (created on first use) by n_new token slots. Requires CanAppend.
  void Append(SeqId seq, int32_t n_new);
  // Releases every block of `seq`; unknown ids are ignored.
  void Free(SeqId seq);
  // With a window: releases the blocks of `seq` that no query at `next_pos` or later can
  // attend to (wholly after the sinks and before the window). No-op without a window.
  void ReleaseOutsideWindow(SeqId seq, int32_t next_pos);
  bool Has(SeqId seq) const { return seqs_.count(seq) != 0; }
  const BlockTable& Table(SeqId seq) const;

  // Writes the K (or V) of the token at `pos` for every kv head of `layer`:
  // k, v: [n_kv_head][head_dim] f32. The slot must be reserved. A KIVI K goes to the staging
  // area, whose block is the one after the last sealed: a sequence's K is written block by
  // block in order, and a position is not written again once its block is sealed.
  void WriteK(SeqId seq, int32_t layer, int32_t pos, const float* k);
  void WriteV(SeqId seq, int32_t layer, int32_t pos, const float* v);
  // KIVI K: quantizes the full staged block of `layer` into the pool and moves the staging on
  // to the next block. Call it once every query that reads the block in f16 (the queries
  // inside it) has attended. No-op for the other formats.
  void SealK(SeqId seq, int32_t layer);

  const uint8_t* BlockData(BlockId id) const {
    return data_.get() + static_cast<size_t>(id.value) * layout_.bytes_per_block();
  }
  // The block of `layer` whose K is in staging, and its rows [n_kv_head][block_size][head_dim]
  // f16; {-1, nullptr} when K is not staged.
  struct StagedK {
    int32_t block_idx;
    const uint16_t* rows;
  };
  StagedK Staged(SeqId seq, int32_t layer) const;

  // Token `idx` of a sequence dequantized, as the model wrote it (a rotated K is rotated
  // back), with the scalar reference routines: out [head_dim]. For the oracle and tests.
  void ReadK(SeqId seq, int32_t layer, int32_t head, int32_t idx, float* out) const;
  void ReadV(SeqId seq, int32_t layer, int32_t head, int32_t idx, float* out) const;

  KVStats Stats() const;
  // Empty when pool and tables agree (every referenced block counted once per table).
  std::string CheckIntegrity() const;

 private:
  struct SeqState {
    BlockTable table;
    // KIVI K only: the logical block each layer stages, and its f16 K.
    std::vector<int32_t> staged_block;  // [n_layer]
    std::vector<uint16_t> staging;      // [n_layer][n_kv_head][block_size][head_dim]
  };

  const SeqState& State(SeqId seq) const;
  SeqState& State(SeqId seq);
  uint8_t* Block(const BlockTable& t, int32_t idx) {
    const BlockId id = t.blocks[idx / block_size()];
    KVLLM_CHECK(id.valid());
    return data_.get() + static_cast<size_t>(id.value) * layout_.bytes_per_block();
  }

  KVLayout layout_;
  KVWindow window_;
  BlockPool pool_;
  // [num_blocks][bytes_per_block], 64-byte aligned
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> data_;
  std::unordered_map<SeqId, SeqState> seqs_;
  std::vector<float> scratch_;  // [3][head_dim] for writes (rotation, sealing)
};

}  // namespace kvllm
