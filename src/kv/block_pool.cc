#include "kv/block_pool.h"

#include <algorithm>

#include "base/status.h"

namespace kvllm {
namespace {

// The free list's order: a min-heap of ids under std::*_heap.
bool HigherId(BlockId a, BlockId b) { return a.value > b.value; }

}  // namespace

BlockPool::BlockPool(int32_t num_blocks) : ref_counts_(num_blocks, 0) {
  KVLLM_CHECK(num_blocks >= 0);
  free_.reserve(num_blocks);
  // Ascending ids are already a min-heap.
  for (int32_t i = 0; i < num_blocks; ++i) free_.push_back(BlockId(i));
}

BlockId BlockPool::Allocate() {
  KVLLM_CHECK(!free_.empty());
  std::pop_heap(free_.begin(), free_.end(), HigherId);
  BlockId id = free_.back();
  free_.pop_back();
  ref_counts_[id.value] = 1;
  return id;
}

void BlockPool::AddRef(BlockId id) {
  KVLLM_CHECK(ref_counts_[id.value] > 0);
  ++ref_counts_[id.value];
}

void BlockPool::Release(BlockId id) {
  KVLLM_CHECK(ref_counts_[id.value] > 0);
  if (--ref_counts_[id.value] == 0) {
    free_.push_back(id);
    std::push_heap(free_.begin(), free_.end(), HigherId);
  }
}

std::string BlockPool::CheckIntegrity() const {
  std::vector<bool> in_free(ref_counts_.size(), false);
  for (BlockId id : free_) {
    if (id.value < 0 || id.value >= num_blocks()) return "free list holds an out-of-range id";
    if (in_free[id.value]) return "block " + std::to_string(id.value) + " is free twice";
    if (ref_counts_[id.value] != 0) {
      return "block " + std::to_string(id.value) + " is free with references";
    }
    in_free[id.value] = true;
  }
  for (int32_t i = 0; i < num_blocks(); ++i) {
    if (ref_counts_[i] < 0) return "block " + std::to_string(i) + " has a negative ref count";
    if (ref_counts_[i] == 0 && !in_free[i]) {
      return "block " + std::to_string(i) + " is unreferenced but not free (leaked)";
    }
  }
  return "";
}

}  // namespace kvllm
