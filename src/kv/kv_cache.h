// KVCache: the paged KV memory of all sequences. Physical memory is one buffer of
// num_blocks blocks (layout in kv_layout.h); each sequence owns a BlockTable mapping its
// logical blocks to physical ones. A sequence with a single contiguous cache is just a table.
//
//   sequence tokens:  [0 ........ S-1][S ....... 2S-1][2S .. n-1]
//   block table:       logical 0 ──▶ 7  logical 1 ──▶ 2  logical 2 ──▶ 5 (partly filled)
//
// Growth is plan-then-commit: CanAppend() changes nothing, Append() cannot fail.
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
  size_t bytes_per_token = 0;
  size_t bytes_per_block = 0;
  int32_t block_size = 0;
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;
  int64_t tokens_stored = 0;  // token slots held, over all sequences
  size_t bytes_allocated = 0; // the whole pool
  size_t bytes_used = 0;      // blocks_used × bytes_per_block
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
  bool Has(SeqId seq) const { return tables_.count(seq) != 0; }
  const BlockTable& Table(SeqId seq) const;

  // Rows of one token slot: `idx` is the token's index in its sequence's cache.
  uint8_t* KRow(const BlockTable& t, int32_t layer, int32_t head, int32_t idx) {
    return BlockBase(t, idx) + layout_.KRowOffset(layer, head, idx % block_size());
  }
  uint8_t* VRow(const BlockTable& t, int32_t layer, int32_t head, int32_t idx) {
    return BlockBase(t, idx) + layout_.VRowOffset(layer, head, idx % block_size());
  }
  const uint8_t* BlockData(BlockId id) const {
    return data_.get() + static_cast<size_t>(id.value) * layout_.bytes_per_block();
  }

  KVStats Stats() const;
  // Empty when pool and tables agree (every referenced block counted once per table).
  std::string CheckIntegrity() const;

 private:
  uint8_t* BlockBase(const BlockTable& t, int32_t idx) {
    return data_.get() +
           static_cast<size_t>(t.blocks[idx / block_size()].value) * layout_.bytes_per_block();
  }

  KVLayout layout_;
  KVWindow window_;
  BlockPool pool_;
  // [num_blocks][bytes_per_block], 64-byte aligned
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> data_;
  std::unordered_map<SeqId, BlockTable> tables_;
};

}  // namespace kvllm
