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
  std::vector<BlockId> blocks;  // logical block i → physical block
  int32_t num_tokens = 0;       // token slots in use; the last block may be partly filled
};

struct KVStats {
  size_t bytes_per_token = 0;
  size_t bytes_per_block = 0;
  int32_t block_size = 0;
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;
  int64_t tokens_stored = 0;  // sum of num_tokens over sequences
  size_t bytes_allocated = 0; // the whole pool
  size_t bytes_used = 0;      // blocks_used × bytes_per_block
  // Slots allocated but holding no token, over all allocated slots (0 when nothing is used).
  double fragmentation = 0;
};

class KVCache {
 public:
  KVCache(KVLayout layout, int32_t num_blocks);
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  const KVLayout& layout() const { return layout_; }
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
  BlockPool pool_;
  // [num_blocks][bytes_per_block], 64-byte aligned
  std::unique_ptr<uint8_t[], void (*)(uint8_t*)> data_;
  std::unordered_map<SeqId, BlockTable> tables_;
};

}  // namespace kvllm
