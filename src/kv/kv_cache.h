// KVCache: the paged KV memory of all sequences. Physical memory is one buffer of
// num_blocks blocks (layout in kv_layout.h); each sequence owns a BlockTable mapping its
// logical blocks to physical ones. A sequence with a single contiguous cache is just a table.
//
//   sequence tokens:  [0 ........ S-1][S ....... 2S-1][2S .. n-1]
//   block table:       logical 0 ──▶ 7  logical 1 ──▶ 2  logical 2 ──▶ 5 (partly filled)
//
// Growth is plan-then-commit: CanAppend() changes nothing, Append() cannot fail.
//
// Blocks are shared by reference count: Fork() gives a second sequence the same table (n > 1
// completions of one prompt), AttachPrefix() gives a new sequence the cached blocks of its
// longest known prefix (prefix_cache.h). Full blocks are never written again; a shared,
// partly filled block is copied before the first write into it (copy-on-write). The prefix
// cache holds one reference to each block it indexes, and its cached-free blocks (no other
// holder) count as available: Append() evicts them, least recently used first.
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
#include <span>
#include <string>
#include <unordered_map>
#include <vector>

#include "base/huge_pages.h"
#include "base/status.h"
#include "kv/block_pool.h"
#include "kv/ids.h"
#include "kv/kv_layout.h"
#include "kv/prefix_cache.h"
#include "kv/store_tiers.h"

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
  int32_t blocks_used = 0;         // held by sequences
  int32_t blocks_cached_free = 0;  // held only by the prefix cache: reusable, evicted on need
  int32_t blocks_free = 0;
  int64_t tokens_stored = 0;  // distinct token positions held by sequences' blocks
  size_t bytes_allocated = 0; // the whole pool
  size_t bytes_used = 0;      // blocks_used × bytes_per_block
  // Outside the pool: the f16 staging of a KIVI K, per live sequence and in all.
  size_t staging_bytes_per_sequence = 0;
  size_t staging_bytes = 0;
  // Slots of the blocks_used holding no token, over those slots (0 when nothing is used).
  double fragmentation = 0;
};

// Why a prefix lookup stopped where it did.
enum class PrefixMiss {
  kNone,           // every block that may be reused was found
  kDisabled,       // prefix caching is off
  kNotCached,      // the block was never computed (or its tokens differ from any cached one)
  kEvicted,        // the block was cached but evicted for memory
};
const char* PrefixMissName(PrefixMiss m);  // "none", "disabled", "not_cached", "evicted"

struct PrefixMatch {
  int32_t tokens = 0;       // tokens reused, a multiple of the block size
  int32_t stored_tokens = 0;  // of those, read from the persistent tiers (store_tiers.h)
  PrefixMiss miss = PrefixMiss::kNone;
  int32_t miss_block = -1;  // logical index of the first block not reused (kNotCached/kEvicted)
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

  // Turns on the prefix cache. `identity` names the model; the KV formats and block size are
  // added here. Off with a sliding window, whose released blocks cannot be a prefix.
  void EnablePrefixCache(uint64_t identity);
  bool prefix_cache_enabled() const { return prefix_enabled_; }
  const PrefixCache& prefix_cache() const { return prefix_; }
  // What a stored block of this cache must match (model, formats, block size, bytes).
  BlockIdentity block_identity() const;
  // Persistent tiers below the prefix cache (not owned; needs the prefix cache): every newly
  // cached full block is written to them in the background, and AttachPrefix reads the
  // blocks memory lacks from them before giving up.
  void AttachStore(StoreTiers* tiers) { store_ = prefix_enabled_ ? tiers : nullptr; }
  StoreTiers* store() const { return store_; }

  // Blocks a sequence needs to hold `n_new` more tokens, copy-on-write included (0 for an
  // unknown sequence with n 0).
  int32_t BlocksNeeded(SeqId seq, int32_t n_new) const;
  // Free blocks plus cached-free ones.
  int32_t available_blocks() const { return pool_.num_free() + prefix_.num_evictable(); }
  // Blocks held by sequences (KVStats::blocks_used without the rest of Stats()' walk).
  int32_t blocks_used() const { return pool_.num_used() - prefix_.num_evictable(); }
  bool CanAppend(SeqId seq, int32_t n_new) const;
  // Grows `seq` (created on first use) by n_new token slots. Requires CanAppend.
  void Append(SeqId seq, int32_t n_new);
  // Releases every block of `seq`; unknown ids are ignored. Its indexed blocks stay cached.
  void Free(SeqId seq);
  // `dst` (new) shares every block of `src`: same tokens, same K/V, no copy until written.
  void Fork(SeqId src, SeqId dst);
  // Gives the new sequence `seq` the cached blocks of the longest prefix of `tokens` that is
  // in the cache, in whole blocks covering at most `max_tokens` tokens. Its cache then holds
  // match.tokens positions, already computed.
  PrefixMatch AttachPrefix(SeqId seq, std::span<const int32_t> tokens, int32_t max_tokens);
  // Indexes the full blocks of `seq` among its first `computed.size()` positions, whose token
  // ids are `computed` and whose K/V are written. No-op with the prefix cache off.
  void CacheFullBlocks(SeqId seq, std::span<const int32_t> computed);
  // Sessions: the records of the full blocks among the first `tokens.size()` positions of
  // `seq` (tokens are its ids), and the reverse — records, in chain order, put into the prefix
  // cache as cached-free blocks while free memory lasts. Returns the blocks imported (a record
  // already cached counts). Both need the prefix cache.
  std::vector<BlockRecord> ExportBlocks(SeqId seq, std::span<const int32_t> tokens) const;
  int32_t ImportBlocks(const std::vector<BlockRecord>& records);
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

  // A head's K tile (k_head_bytes) and V rows (v_head_bytes) in block `id`. The pool keeps
  // each (layer, K or V, head) tile of all blocks in a region of its own, block after block,
  // as the model reads it: attention reads one head of one layer over a sequence's blocks, so
  // blocks allocated in order make it one stream, not a few KiB at a stride of a whole block.
  const uint8_t* KHead(BlockId id, int32_t layer, int32_t head) const {
    return Tile(id, layout_.KHeadOffset(layer, head), layout_.k_head_bytes());
  }
  const uint8_t* VHead(BlockId id, int32_t layer, int32_t head) const {
    return Tile(id, layout_.VHeadOffset(layer, head), layout_.v_head_bytes());
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
  // Empty when pool, tables and prefix cache agree: every block's ref count is its table
  // entries plus one if the prefix cache indexes it.
  std::string CheckIntegrity() const;

 private:
  struct SeqState {
    BlockTable table;
    // KIVI K only: the logical block each layer stages, and its f16 K.
    std::vector<int32_t> staged_block;  // [n_layer]
    std::vector<uint16_t> staging;      // [n_layer][n_kv_head][block_size][head_dim]
    // Prefix cache: full blocks hashed so far, and the last one's hash (the chain's parent).
    int32_t n_hashed = 0;
    BlockHash last_hash = 0;
  };

  const SeqState& State(SeqId seq) const;
  SeqState& State(SeqId seq);
  SeqState& Create(SeqId seq);
  // Takes a free block, evicting the oldest cached-free block if none is free.
  BlockId AllocateBlock();
  // Drops one reference; a cached block left only to the cache becomes evictable.
  void ReleaseBlock(BlockId id);
  // Whether the last block of `t` is partly filled and shared, so that a write copies it.
  bool NeedsCopy(const BlockTable& t) const;
  BlockRecord MakeRecord(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                         BlockId id) const;
  // Copies a stored block into a newly allocated block indexed by the prefix cache; the block
  // is held by the cache only. Invalid when no block is available.
  BlockId Load(const BlockRecord& r);
  // The tile at `offset` of a block record (of `bytes`, the tile's size) of block `id`: its
  // region starts at num_blocks × offset, as every tile before it in a record has a region of
  // num_blocks tiles.
  uint8_t* Tile(BlockId id, size_t offset, size_t bytes) const {
    KVLLM_CHECK(id.valid());
    return data_.data() + static_cast<size_t>(pool_.num_blocks()) * offset +
           static_cast<size_t>(id.value) * bytes;
  }
  // The block of the position `pos` of `t`.
  BlockId At(const BlockTable& t, int32_t pos) const { return t.blocks[pos / block_size()]; }
  uint8_t* KHead(const BlockTable& t, int32_t pos, int32_t layer, int32_t head) {
    return Tile(At(t, pos), layout_.KHeadOffset(layer, head), layout_.k_head_bytes());
  }
  uint8_t* VRow(const BlockTable& t, int32_t pos, int32_t layer, int32_t head) {
    return Tile(At(t, pos), layout_.VHeadOffset(layer, head), layout_.v_head_bytes()) +
           static_cast<size_t>(pos % block_size()) * layout_.v_row_bytes();
  }

  KVLayout layout_;
  KVWindow window_;
  BlockPool pool_;
  PrefixCache prefix_;
  bool prefix_enabled_ = false;
  uint64_t model_identity_ = 0;
  uint64_t identity_ = 0;  // the model's, the formats' and the block size's: seeds the chain
  StoreTiers* store_ = nullptr;
  HugePageBuffer data_;  // per head tile of a block record (KVLayout): [num_blocks][tile]
  std::unordered_map<SeqId, SeqState> seqs_;
  std::vector<float> scratch_;  // [3][head_dim] for writes (rotation, sealing)
};

}  // namespace kvllm
