#include "kv/kv_cache.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <new>

#include "kv/hadamard.h"
#include "kv/kivi.h"
#include "tensor/quant.h"

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
            &FreeAligned),
      scratch_(3 * static_cast<size_t>(layout.shape().head_dim)) {}

int32_t KVCache::BlocksNeeded(SeqId seq, int32_t n_new) const {
  auto it = seqs_.find(seq);
  int32_t have_tokens = it == seqs_.end() ? 0 : it->second.table.num_tokens;
  int32_t have_blocks =
      it == seqs_.end() ? 0 : static_cast<int32_t>(it->second.table.blocks.size());
  return CeilDiv(have_tokens + n_new, block_size()) - have_blocks;
}

bool KVCache::CanAppend(SeqId seq, int32_t n_new) const {
  return n_new >= 0 && pool_.CanAllocate(BlocksNeeded(seq, n_new));
}

void KVCache::Append(SeqId seq, int32_t n_new) {
  KVLLM_CHECK(CanAppend(seq, n_new));
  int32_t need = BlocksNeeded(seq, n_new);
  auto [it, created] = seqs_.try_emplace(seq);
  SeqState& s = it->second;
  if (created && layout_.k_format().staged(KVRole::kK)) {
    s.staged_block.assign(layout_.shape().n_layer, 0);
    s.staging.assign(layout_.staging_bytes_per_sequence() / sizeof(uint16_t), 0);
  }
  for (int32_t i = 0; i < need; ++i) s.table.blocks.push_back(pool_.Allocate());
  s.table.num_tokens += n_new;
}

void KVCache::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (BlockId id : it->second.table.blocks) {
    if (id.valid()) pool_.Release(id);
  }
  seqs_.erase(it);
}

void KVCache::ReleaseOutsideWindow(SeqId seq, int32_t next_pos) {
  auto it = seqs_.find(seq);
  if (!window_.enabled() || it == seqs_.end()) return;
  const int32_t begin = window_.WindowBegin(next_pos);
  if (begin == 0) return;
  // Blocks [first, last) lie wholly in [sinks, begin). The staged block holds next_pos, so it
  // is never among them.
  std::vector<BlockId>& blocks = it->second.table.blocks;
  const int32_t first = (window_.sinks + block_size() - 1) / block_size();
  const int32_t last = std::min<int32_t>(begin / block_size(), blocks.size());
  for (int32_t b = first; b < last; ++b) {
    if (!blocks[b].valid()) continue;
    pool_.Release(blocks[b]);
    blocks[b] = BlockId();
  }
}

const KVCache::SeqState& KVCache::State(SeqId seq) const {
  auto it = seqs_.find(seq);
  KVLLM_CHECK(it != seqs_.end());
  return it->second;
}

KVCache::SeqState& KVCache::State(SeqId seq) {
  auto it = seqs_.find(seq);
  KVLLM_CHECK(it != seqs_.end());
  return it->second;
}

const BlockTable& KVCache::Table(SeqId seq) const { return State(seq).table; }

void KVCache::WriteK(SeqId seq, int32_t layer, int32_t pos, const float* k) {
  SeqState& s = State(seq);
  KVLLM_CHECK(pos < s.table.num_tokens);
  const KVFormat f = layout_.k_format();
  const int32_t n_head = layout_.shape().n_kv_head, d = layout_.shape().head_dim;
  const int32_t bs = block_size(), slot = pos % bs;
  if (f.staged(KVRole::kK)) {
    KVLLM_CHECK(pos / bs == s.staged_block[layer]);
    // [n_kv_head][block_size][head_dim] of this layer
    uint16_t* rows = s.staging.data() + static_cast<size_t>(layer) * n_head * bs * d;
    for (int32_t h = 0; h < n_head; ++h) {
      QuantizeRow(DType::kF16, k + int64_t{h} * d, rows + (int64_t{h} * bs + slot) * d, d);
    }
    return;
  }
  uint8_t* block = Block(s.table, pos);
  for (int32_t h = 0; h < n_head; ++h) {
    const float* row = k + int64_t{h} * d;
    if (f.rotated()) {
      std::copy(row, row + d, scratch_.data());
      HadamardRotate(scratch_.data(), d);
      row = scratch_.data();
    }
    QuantizeRow(f.row_type(), row, block + layout_.KRowOffset(layer, h, slot), d);
  }
}

void KVCache::WriteV(SeqId seq, int32_t layer, int32_t pos, const float* v) {
  const BlockTable& t = Table(seq);
  KVLLM_CHECK(pos < t.num_tokens);
  const KVFormat f = layout_.v_format();
  const int32_t d = layout_.shape().head_dim;
  uint8_t* block = Block(t, pos);
  for (int32_t h = 0; h < layout_.shape().n_kv_head; ++h) {
    uint8_t* row = block + layout_.VRowOffset(layer, h, pos % block_size());
    if (f.is_kivi()) {
      kivi::QuantizeVRow(f.bits(), v + int64_t{h} * d, row, d);
    } else {
      QuantizeRow(f.row_type(), v + int64_t{h} * d, row, d);
    }
  }
}

void KVCache::SealK(SeqId seq, int32_t layer) {
  const KVFormat f = layout_.k_format();
  if (!f.staged(KVRole::kK)) return;
  SeqState& s = State(seq);
  const int32_t n_head = layout_.shape().n_kv_head, d = layout_.shape().head_dim;
  const int32_t bs = block_size();
  const int32_t b = s.staged_block[layer];
  uint8_t* block = Block(s.table, b * bs);
  const uint16_t* rows = s.staging.data() + static_cast<size_t>(layer) * n_head * bs * d;
  for (int32_t h = 0; h < n_head; ++h) {
    kivi::QuantizeKTile(f.bits(), rows + static_cast<size_t>(h) * bs * d, bs, d,
                        block + layout_.KHeadOffset(layer, h), scratch_.data());
  }
  s.staged_block[layer] = b + 1;
}

KVCache::StagedK KVCache::Staged(SeqId seq, int32_t layer) const {
  if (!layout_.k_format().staged(KVRole::kK)) return {-1, nullptr};
  const SeqState& s = State(seq);
  const auto& shape = layout_.shape();
  return {s.staged_block[layer],
          s.staging.data() + static_cast<size_t>(layer) * shape.n_kv_head * block_size() *
                                 shape.head_dim};
}

void KVCache::ReadK(SeqId seq, int32_t layer, int32_t head, int32_t idx, float* out) const {
  const BlockTable& t = Table(seq);
  const KVFormat f = layout_.k_format();
  const int32_t d = layout_.shape().head_dim, bs = block_size();
  const StagedK staged = Staged(seq, layer);
  if (idx / bs == staged.block_idx) {
    DequantizeRow(DType::kF16, staged.rows + (int64_t{head} * bs + idx % bs) * d, out, d);
    return;
  }
  const uint8_t* block = BlockData(t.blocks[idx / bs]);
  if (f.is_kivi()) {
    kivi::DequantizeKSlot(f.bits(), block + layout_.KHeadOffset(layer, head), idx % bs, d, out);
    return;
  }
  DequantizeRow(f.row_type(), block + layout_.KRowOffset(layer, head, idx % bs), out, d);
  if (f.rotated()) HadamardUnrotate(out, d);
}

void KVCache::ReadV(SeqId seq, int32_t layer, int32_t head, int32_t idx, float* out) const {
  const BlockTable& t = Table(seq);
  const KVFormat f = layout_.v_format();
  const int32_t d = layout_.shape().head_dim, bs = block_size();
  const uint8_t* row = BlockData(t.blocks[idx / bs]) + layout_.VRowOffset(layer, head, idx % bs);
  if (f.is_kivi()) {
    kivi::DequantizeVRow(f.bits(), row, out, d);
  } else {
    DequantizeRow(f.row_type(), row, out, d);
  }
}

KVStats KVCache::Stats() const {
  KVStats s;
  s.bytes_per_token = layout_.bytes_per_token();
  s.bytes_per_block = layout_.bytes_per_block();
  s.block_size = block_size();
  s.blocks_total = pool_.num_blocks();
  s.blocks_used = pool_.num_used();
  for (const auto& [seq, state] : seqs_) {
    const auto& blocks = state.table.blocks;
    const auto released =
        std::count_if(blocks.begin(), blocks.end(), [](BlockId id) { return !id.valid(); });
    s.tokens_stored += state.table.num_tokens - released * block_size();
    s.staging_bytes += state.staging.size() * sizeof(uint16_t);
  }
  s.bytes_allocated = static_cast<size_t>(s.blocks_total) * s.bytes_per_block;
  s.bytes_used = static_cast<size_t>(s.blocks_used) * s.bytes_per_block;
  s.staging_bytes_per_sequence = layout_.staging_bytes_per_sequence();
  int64_t slots = int64_t{s.blocks_used} * block_size();
  s.fragmentation = slots == 0 ? 0.0 : static_cast<double>(slots - s.tokens_stored) / slots;
  return s;
}

std::string KVCache::CheckIntegrity() const {
  std::string pool_problem = pool_.CheckIntegrity();
  if (!pool_problem.empty()) return pool_problem;
  std::vector<int32_t> refs(pool_.num_blocks(), 0);
  const bool staged = layout_.k_format().staged(KVRole::kK);
  for (const auto& [seq, state] : seqs_) {
    const BlockTable& t = state.table;
    const std::string name = "sequence " + std::to_string(seq.value);
    if (static_cast<int32_t>(t.blocks.size()) != CeilDiv(t.num_tokens, block_size())) {
      return name + " has a table of the wrong length";
    }
    for (BlockId id : t.blocks) {
      if (id.valid()) ++refs[id.value];
    }
    if (state.staging.size() * sizeof(uint16_t) != layout_.staging_bytes_per_sequence()) {
      return name + " has a K staging area of the wrong size";
    }
    // The staged block is the next one to fill: reserved and held, or just past the table.
    for (int32_t b : state.staged_block) {
      const int32_t n = static_cast<int32_t>(t.blocks.size());
      if (b < 0 || b > n || (b < n && !t.blocks[b].valid())) {
        return name + " stages K of block " + std::to_string(b) + " it does not hold";
      }
    }
    if (staged != !state.staged_block.empty()) return name + " has no staged block per layer";
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
