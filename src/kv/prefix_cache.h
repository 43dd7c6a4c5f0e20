// PrefixCache: the index that lets a new sequence reuse the K/V of a prefix another sequence
// already computed. A full block is named by a hash chain,
//
//   hash(block i) = H(hash(block i-1), identity, the block's token ids)
//
// where `identity` names the model and the KV formats, so a block is found only by a prefix
// equal in every token up to and including it, computed by the same model into the same
// format. The index keeps each cached block's token ids and compares them on a hit, so a hash
// collision is a miss, never wrong K/V.
//
// The cache holds one reference to every block it indexes (see KVCache): a block whose only
// reference is the cache's is "cached-free". Such blocks sit in an LRU and are evicted, oldest
// first, when the pool needs memory. Evicted hashes are remembered for a while so that a later
// miss can say why it missed. Bookkeeping only: never touches K/V memory.
#pragma once

#include <cstdint>
#include <deque>
#include <list>
#include <span>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "kv/ids.h"

namespace kvllm {

using BlockHash = uint64_t;

// XXH3 of a byte string (a model file's header names the model).
uint64_t HashBytes(std::span<const uint8_t> bytes);

// Hash of a block from its parent's hash (0 for the first block), the cache identity and the
// block's token ids (XXH3).
BlockHash HashBlock(BlockHash parent, uint64_t identity, std::span<const int32_t> tokens);

class PrefixCache {
 public:
  explicit PrefixCache(int32_t num_blocks);

  // The cached block named `hash` holding exactly `tokens`; invalid if none.
  BlockId Find(BlockHash hash, std::span<const int32_t> tokens) const;
  // Indexes `id` under `hash`; false (nothing changes) if the hash is already indexed, e.g.
  // when two sequences computed the same prefix at once.
  bool Insert(BlockHash hash, BlockId id, std::span<const int32_t> tokens);
  bool Contains(BlockId id) const { return entries_[id.value].indexed; }
  BlockHash HashOf(BlockId id) const { return entries_[id.value].hash; }

  // LRU of cached-free blocks: a block joins when its last user leaves and leaves when a
  // sequence takes it again or it is evicted.
  void MakeEvictable(BlockId id);
  void Pin(BlockId id);
  bool Evictable(BlockId id) const { return entries_[id.value].evictable; }
  int32_t num_evictable() const { return static_cast<int32_t>(lru_.size()); }
  int32_t num_indexed() const { return static_cast<int32_t>(by_hash_.size()); }
  // Removes the least recently used cached-free block from the index and returns it; the
  // caller drops the cache's reference. Requires num_evictable() > 0.
  BlockId EvictOldest();
  // Whether `hash` was evicted recently (a bounded memory, for miss reasons).
  bool WasEvicted(BlockHash hash) const { return evicted_set_.count(hash) != 0; }
  int64_t evictions() const { return evictions_; }

  // Empty when the index, the entries and the LRU agree; otherwise what is wrong.
  std::string CheckIntegrity() const;

 private:
  struct Entry {
    bool indexed = false;
    bool evictable = false;
    BlockHash hash = 0;
    std::vector<int32_t> tokens;
    std::list<BlockId>::iterator lru_pos;
  };
  static constexpr size_t kEvictedMemory = 4096;

  std::vector<Entry> entries_;  // [num_blocks]
  std::unordered_map<BlockHash, BlockId> by_hash_;
  std::list<BlockId> lru_;  // oldest first
  std::deque<BlockHash> evicted_order_;
  std::unordered_set<BlockHash> evicted_set_;
  int64_t evictions_ = 0;
};

}  // namespace kvllm
