#include "kv/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

namespace kvllm {
namespace {

uint8_t* AllocateAligned(size_t bytes) {
  size_t rounded = (bytes + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, rounded == 0 ? 64 : rounded);
  if (p == nullptr) throw std::bad_alloc();
  return static_cast<uint8_t*>(p);
}

void FreeAligned(uint8_t* p) { std::free(p); }

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

}  // namespace

KVCache::KVCache(KVLayout layout, int32_t num_blocks, KVWindow window)
    : layout_(layout),
      window_(window),
      pool_(num_blocks),
      data_(AllocateAligned(static_cast<size_t>(num_blocks) * layout.bytes_per_block()),
            &FreeAligned) {}

int32_t KVCache::BlocksNeeded(SeqId seq, int32_t n_new) const {
  auto it = tables_.find(seq);
  int32_t have_tokens = it == tables_.end() ? 0 : it->second.num_tokens;
  int32_t have_blocks = it == tables_.end() ? 0 : static_cast<int32_t>(it->second.blocks.size());
  return CeilDiv(have_tokens + n_new, block_size()) - have_blocks;
}

bool KVCache::CanAppend(SeqId seq, int32_t n_new) const {
  return n_new >= 0 && pool_.CanAllocate(BlocksNeeded(seq, n_new));
}

void KVCache::Append(SeqId seq, int32_t n_new) {
  KVLLM_CHECK(CanAppend(seq, n_new));
  int32_t need = BlocksNeeded(seq, n_new);
  BlockTable& t = tables_[seq];
  for (int32_t i = 0; i < need; ++i) t.blocks.push_back(pool_.Allocate());
  t.num_tokens += n_new;
}

void KVCache::Free(SeqId seq) {
  auto it = tables_.find(seq);
  if (it == tables_.end()) return;
  for (BlockId id : it->second.blocks) {
    if (id.valid()) pool_.Release(id);
  }
  tables_.erase(it);
}

void KVCache::ReleaseOutsideWindow(SeqId seq, int32_t next_pos) {
  auto it = tables_.find(seq);
  if (!window_.enabled() || it == tables_.end()) return;
  const int32_t begin = window_.WindowBegin(next_pos);
  if (begin == 0) return;
  // Blocks [first, last) lie wholly in [sinks, begin).
  const int32_t first = (window_.sinks + block_size() - 1) / block_size();
  const int32_t last = std::min<int32_t>(begin / block_size(), it->second.blocks.size());
  for (int32_t b = first; b < last; ++b) {
    BlockId& id = it->second.blocks[b];
    if (!id.valid()) continue;
    pool_.Release(id);
    id = BlockId();
  }
}

const BlockTable& KVCache::Table(SeqId seq) const {
  auto it = tables_.find(seq);
  KVLLM_CHECK(it != tables_.end());
  return it->second;
}

KVStats KVCache::Stats() const {
  KVStats s;
  s.bytes_per_token = layout_.bytes_per_token();
  s.bytes_per_block = layout_.bytes_per_block();
  s.block_size = block_size();
  s.blocks_total = pool_.num_blocks();
  s.blocks_used = pool_.num_used();
  for (const auto& [seq, t] : tables_) {
    const auto released = std::count_if(t.blocks.begin(), t.blocks.end(),
                                        [](BlockId id) { return !id.valid(); });
    s.tokens_stored += t.num_tokens - released * block_size();
  }
  s.bytes_allocated = static_cast<size_t>(s.blocks_total) * s.bytes_per_block;
  s.bytes_used = static_cast<size_t>(s.blocks_used) * s.bytes_per_block;
  int64_t slots = int64_t{s.blocks_used} * block_size();
  s.fragmentation = slots == 0 ? 0.0 : static_cast<double>(slots - s.tokens_stored) / slots;
  return s;
}

std::string KVCache::CheckIntegrity() const {
  std::string pool_problem = pool_.CheckIntegrity();
  if (!pool_problem.empty()) return pool_problem;
  std::vector<int32_t> refs(pool_.num_blocks(), 0);
  for (const auto& [seq, t] : tables_) {
    if (static_cast<int32_t>(t.blocks.size()) != CeilDiv(t.num_tokens, block_size())) {
      return "sequence " + std::to_string(seq.value) + " has a table of the wrong length";
    }
    for (BlockId id : t.blocks) {
      if (id.valid()) ++refs[id.value];
    }
  }
  for (int32_t i = 0; i < pool_.num_blocks(); ++i) {
    if (refs[i] != pool_.ref_count(BlockId(i))) {
      return "block " + std::to_string(i) + ": ref count " +
             std::to_string(pool_.ref_count(BlockId(i))) + " but " + std::to_string(refs[i]) +
             " table entries";
    }
  }
  return "";
}

}  // namespace kvllm
