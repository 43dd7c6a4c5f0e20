#include "kv/prefix_cache.h"

#include <algorithm>
#include <string>
#include <xxhash.h>

#include "base/status.h"

namespace kvllm {

uint64_t HashBytes(std::span<const uint8_t> bytes) { return XXH3_64bits(bytes.data(), bytes.size()); }

BlockHash HashBlock(BlockHash parent, uint64_t identity, std::span<const int32_t> tokens) {
  const uint64_t head[2] = {parent, identity};
  return XXH3_64bits_withSeed(tokens.data(), tokens.size_bytes(), XXH3_64bits(head, sizeof(head)));
}

PrefixCache::PrefixCache(int32_t num_blocks) : entries_(num_blocks) {}

BlockId PrefixCache::Find(BlockHash hash, std::span<const int32_t> tokens) const {
  auto it = by_hash_.find(hash);
  if (it == by_hash_.end()) return BlockId();
  const std::vector<int32_t>& have = entries_[it->second.value].tokens;
  if (!std::equal(have.begin(), have.end(), tokens.begin(), tokens.end())) return BlockId();
  return it->second;
}

bool PrefixCache::Insert(BlockHash hash, BlockId id, std::span<const int32_t> tokens) {
  Entry& e = entries_[id.value];
  KVLLM_CHECK(!e.indexed);
  if (!by_hash_.emplace(hash, id).second) return false;
  e.indexed = true;
  e.hash = hash;
  e.tokens.assign(tokens.begin(), tokens.end());
  if (evicted_set_.erase(hash) != 0) {
    std::erase(evicted_order_, hash);
  }
  return true;
}

void PrefixCache::MakeEvictable(BlockId id) {
  Entry& e = entries_[id.value];
  KVLLM_CHECK(e.indexed && !e.evictable);
  e.evictable = true;
  e.lru_pos = lru_.insert(lru_.end(), id);
}

void PrefixCache::Pin(BlockId id) {
  Entry& e = entries_[id.value];
  if (!e.evictable) return;
  lru_.erase(e.lru_pos);
  e.evictable = false;
}

BlockId PrefixCache::EvictOldest() {
  KVLLM_CHECK(!lru_.empty());
  const BlockId id = lru_.front();
  lru_.pop_front();
  Entry& e = entries_[id.value];
  by_hash_.erase(e.hash);
  if (evicted_set_.insert(e.hash).second) evicted_order_.push_back(e.hash);
  if (evicted_order_.size() > kEvictedMemory) {
    evicted_set_.erase(evicted_order_.front());
    evicted_order_.pop_front();
  }
  e = Entry{};
  ++evictions_;
  return id;
}

std::string PrefixCache::CheckIntegrity() const {
  size_t indexed = 0, evictable = 0;
  for (size_t i = 0; i < entries_.size(); ++i) {
    const Entry& e = entries_[i];
    if (e.evictable && !e.indexed) return "block " + std::to_string(i) + " evictable, not indexed";
    if (!e.indexed) continue;
    ++indexed;
    evictable += e.evictable ? 1 : 0;
    auto it = by_hash_.find(e.hash);
    if (it == by_hash_.end() || it->second.value != static_cast<int32_t>(i)) {
      return "block " + std::to_string(i) + " is not under its hash in the index";
    }
  }
  if (indexed != by_hash_.size()) return "the index names blocks that are not cached";
  if (evictable != lru_.size()) return "the LRU and the evictable blocks disagree";
  return "";
}

}  // namespace kvllm
