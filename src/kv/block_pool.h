// BlockPool: bookkeeping for a fixed number of KV blocks. It hands out block ids and counts
// references; it never touches the memory the ids name (KVCache owns that). A block is free
// exactly when its ref count is 0. Not thread-safe: the engine's step loop owns it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "kv/ids.h"

namespace kvllm {

class BlockPool {
 public:
  explicit BlockPool(int32_t num_blocks);

  int32_t num_blocks() const { return static_cast<int32_t>(ref_counts_.size()); }
  int32_t num_free() const { return static_cast<int32_t>(free_.size()); }
  int32_t num_used() const { return num_blocks() - num_free(); }

  bool CanAllocate(int32_t n) const { return n <= num_free(); }
  // Takes a free block (ref count 1). The caller checked CanAllocate first.
  BlockId Allocate();
  void AddRef(BlockId id);
  // Drops one reference; the block returns to the free list when none is left.
  void Release(BlockId id);
  int32_t ref_count(BlockId id) const { return ref_counts_[id.value]; }

  // Empty when the free list and the ref counts agree; otherwise what is wrong.
  std::string CheckIntegrity() const;

 private:
  std::vector<int32_t> ref_counts_;  // [num_blocks]
  // A min-heap of ids: the lowest free id is handed out first, so a sequence that grows into
  // a stretch of free blocks gets them adjacent and ascending, whatever order they were freed
  // in. Attention reads a run of adjacent blocks as one stream in one kernel call
  // (attention.cc); handing out the most recently freed block first gave the sequence after a
  // freed one its blocks backwards, every block a run of its own (docs/performance.md).
  std::vector<BlockId> free_;
};

}  // namespace kvllm
