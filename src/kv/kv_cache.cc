#include "kv/kv_cache.h"

#include <algorithm>
#include <cstring>
#include <new>
#include <optional>
#include <string>
#include <unordered_map>

#include "kv/hadamard.h"
#include "kv/kivi.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/quant.h"

namespace kvllm {
namespace {

// Decode reads every block of a sequence on every token, a few KiB per block, layer and head:
// in 4 KiB pages nearly every such read would be a TLB miss.
HugePageBuffer AllocatePool(size_t bytes) {
  HugePageBuffer pool = HugePageBuffer::Allocate(bytes);
  if (pool.data() == nullptr) throw std::bad_alloc();
  return pool;
}

int32_t CeilDiv(int32_t a, int32_t b) { return (a + b - 1) / b; }

// x as a row of type t at `row`: f16 through the SIMD level's conversion (QuantizeRow's bits,
// several times faster; every token writes 2 x n_kv_head rows a layer).
void StoreRow(DType t, const float* x, uint8_t* row, int32_t d) {
  if (t == DType::kF16) return Kernels().to_f16(x, reinterpret_cast<uint16_t*>(row), d);
  QuantizeRow(t, x, row, d);
}

// One token's K row into a head's dimension-major part of a block of bs slots (an f16 K:
// [d][bs]; a Q8_0 K: Q8DimsLayout), at `slot`.
void WriteDimensionMajor(KVFormat f, const float* row, int32_t d, int32_t bs, int32_t slot,
                         uint8_t* head) {
  if (f.row_type() == DType::kF16) {
    auto* dims = reinterpret_cast<uint16_t*>(head) + slot;
    uint16_t half[64];
    for (int32_t i0 = 0; i0 < d; i0 += 64) {
      const int32_t n = std::min(64, d - i0);
      Kernels().to_f16(row + i0, half, n);
      for (int32_t i = 0; i < n; ++i) dims[int64_t{i0 + i} * bs] = half[i];
    }
    return;
  }
  const Q8DimsLayout lay{bs};
  for (int32_t b = 0; b < d / kQK; ++b) {
    BlockQ8_0 group;
    QuantizeRow(DType::kQ8_0, row + int64_t{b} * kQK, &group, kQK);
    std::memcpy(head + lay.ScaleOffset(b, slot), &group.d, sizeof group.d);
    for (int32_t i = 0; i < kQK; ++i) {
      head[lay.CodeOffset(b, i, slot)] = static_cast<uint8_t>(group.qs[i]);
    }
  }
}

// The inverse: `slot`'s K row as floats, as DequantizeRow gives it from a row.
void ReadDimensionMajor(KVFormat f, const uint8_t* head, int32_t d, int32_t bs, int32_t slot,
                        float* out) {
  if (f.row_type() == DType::kF16) {
    const auto* dims = reinterpret_cast<const uint16_t*>(head) + slot;
    for (int32_t i = 0; i < d; ++i) out[i] = F16ToF32(dims[int64_t{i} * bs]);
    return;
  }
  const Q8DimsLayout lay{bs};
  for (int32_t b = 0; b < d / kQK; ++b) {
    uint16_t dh;
    std::memcpy(&dh, head + lay.ScaleOffset(b, slot), sizeof dh);
    const float scale = F16ToF32(dh);
    for (int32_t i = 0; i < kQK; ++i) {
      out[b * kQK + i] = scale * static_cast<int8_t>(head[lay.CodeOffset(b, i, slot)]);
    }
  }
}

}  // namespace

KVCache::KVCache(KVLayout layout, int32_t num_blocks, KVWindow window)
    : layout_(layout),
      window_(window),
      pool_(num_blocks),
      prefix_(num_blocks),
      data_(AllocatePool(static_cast<size_t>(num_blocks) * layout.bytes_per_block())),
      scratch_(3 * static_cast<size_t>(layout.shape().head_dim)) {}

const char* PrefixMissName(PrefixMiss m) {
  switch (m) {
    case PrefixMiss::kNone: return "none";
    case PrefixMiss::kDisabled: return "disabled";
    case PrefixMiss::kNotCached: return "not_cached";
    case PrefixMiss::kEvicted: return "evicted";
  }
  return "?";
}

void KVCache::EnablePrefixCache(uint64_t identity) {
  if (window_.enabled()) return;
  // The formats and block size join the model's identity: K/V written in another format or
  // laid out in other blocks is another block.
  std::string name = std::string(layout_.k_format().name()) + "/" + layout_.v_format().name() +
                     "/" + std::to_string(block_size());
  std::vector<int32_t> bytes(name.begin(), name.end());
  model_identity_ = identity;
  identity_ = HashBlock(identity, 0, bytes);
  prefix_enabled_ = true;
}

BlockIdentity KVCache::block_identity() const {
  return BlockIdentity{model_identity_, layout_.k_format().name(), layout_.v_format().name(),
                       block_size(), layout_.bytes_per_block()};
}

BlockRecord KVCache::MakeRecord(BlockHash hash, BlockHash parent, std::span<const int32_t> tokens,
                                BlockId id) const {
  BlockRecord r;
  r.hash = hash;
  r.parent = parent;
  r.model_identity = model_identity_;
  r.k_format = layout_.k_format().name();
  r.v_format = layout_.v_format().name();
  r.block_size = block_size();
  r.tokens.assign(tokens.begin(), tokens.end());
  r.data.resize(layout_.bytes_per_block());
  layout_.ForEachHeadTile([&](size_t offset, size_t bytes) {
    std::memcpy(r.data.data() + offset, Tile(id, offset, bytes), bytes);
  });
  return r;
}

BlockId KVCache::Load(const BlockRecord& r) {
  if (available_blocks() == 0) return BlockId();
  const BlockId id = AllocateBlock();
  layout_.ForEachHeadTile([&](size_t offset, size_t bytes) {
    std::memcpy(Tile(id, offset, bytes), r.data.data() + offset, bytes);
  });
  KVLLM_CHECK(prefix_.Insert(r.hash, id, r.tokens));
  // The allocation's reference becomes the cache's: the block is cached-free until taken.
  prefix_.MakeEvictable(id);
  return id;
}

bool KVCache::NeedsCopy(const BlockTable& t) const {
  return t.num_tokens % block_size() != 0 && pool_.ref_count(t.blocks.back()) > 1;
}

int32_t KVCache::BlocksNeeded(SeqId seq, int32_t n_new) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return CeilDiv(n_new, block_size());
  const BlockTable& t = it->second.table;
  const int32_t grow = CeilDiv(t.num_tokens + n_new, block_size()) -
                       static_cast<int32_t>(t.blocks.size());
  return grow + (n_new > 0 && NeedsCopy(t) ? 1 : 0);
}

bool KVCache::CanAppend(SeqId seq, int32_t n_new) const {
  return n_new >= 0 && BlocksNeeded(seq, n_new) <= available_blocks();
}

BlockId KVCache::AllocateBlock() {
  if (!pool_.CanAllocate(1)) pool_.Release(prefix_.EvictOldest());
  return pool_.Allocate();
}

void KVCache::ReleaseBlock(BlockId id) {
  pool_.Release(id);
  if (prefix_.Contains(id) && pool_.ref_count(id) == 1) prefix_.MakeEvictable(id);
}

KVCache::SeqState& KVCache::Create(SeqId seq) {
  auto [it, created] = seqs_.try_emplace(seq);
  KVLLM_CHECK(created);
  SeqState& s = it->second;
  if (layout_.k_format().staged(KVRole::kK)) {
    s.staged_block.assign(layout_.shape().n_layer, 0);
    s.staging.assign(layout_.staging_bytes_per_sequence() / sizeof(uint16_t), 0);
  }
  return s;
}

void KVCache::Append(SeqId seq, int32_t n_new) {
  KVLLM_CHECK(CanAppend(seq, n_new));
  SeqState& s = seqs_.count(seq) != 0 ? seqs_.at(seq) : Create(seq);
  BlockTable& t = s.table;
  if (n_new > 0 && NeedsCopy(t)) {
    const BlockId shared = t.blocks.back();
    const BlockId own = AllocateBlock();
    layout_.ForEachHeadTile([&](size_t offset, size_t bytes) {
      std::memcpy(Tile(own, offset, bytes), Tile(shared, offset, bytes), bytes);
    });
    t.blocks.back() = own;
    ReleaseBlock(shared);
  }
  const int32_t grow = CeilDiv(t.num_tokens + n_new, block_size()) -
                       static_cast<int32_t>(t.blocks.size());
  for (int32_t i = 0; i < grow; ++i) t.blocks.push_back(AllocateBlock());
  t.num_tokens += n_new;
}

void KVCache::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (BlockId id : it->second.table.blocks) {
    if (id.valid()) ReleaseBlock(id);
  }
  seqs_.erase(it);
}

void KVCache::Fork(SeqId src, SeqId dst) {
  const SeqState& from = State(src);
  KVLLM_CHECK(!Has(dst));
  SeqState copy = from;
  for (BlockId id : copy.table.blocks) {
    if (id.valid()) pool_.AddRef(id);
  }
  seqs_.emplace(dst, std::move(copy));
}

PrefixMatch KVCache::AttachPrefix(SeqId seq, std::span<const int32_t> tokens,
                                  int32_t max_tokens) {
  KVLLM_CHECK(!Has(seq));
  SeqState& s = Create(seq);
  PrefixMatch match;
  if (!prefix_enabled_) {
    match.miss = PrefixMiss::kDisabled;
    return match;
  }
  const int32_t bs = block_size();
  const int32_t n_blocks =
      std::min<int32_t>(static_cast<int32_t>(tokens.size()), max_tokens) / bs;
  BlockHash parent = 0;
  for (int32_t b = 0; b < n_blocks; ++b) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(b) * bs, bs);
    const BlockHash h = HashBlock(parent, identity_, block_tokens);
    BlockId id = prefix_.Find(h, block_tokens);
    if (!id.valid() && store_ != nullptr) {
      if (std::optional<BlockRecord> r = store_->Read(h, parent, block_tokens)) {
        id = Load(*r);
        match.stored_tokens += id.valid() ? bs : 0;
      }
    }
    if (!id.valid()) {
      match.miss = prefix_.WasEvicted(h) ? PrefixMiss::kEvicted : PrefixMiss::kNotCached;
      match.miss_block = b;
      break;
    }
    pool_.AddRef(id);
    prefix_.Pin(id);
    s.table.blocks.push_back(id);
    s.table.num_tokens += bs;
    parent = h;
  }
  s.n_hashed = static_cast<int32_t>(s.table.blocks.size());
  s.last_hash = parent;
  std::fill(s.staged_block.begin(), s.staged_block.end(), s.n_hashed);
  match.tokens = s.table.num_tokens;
  return match;
}

void KVCache::CacheFullBlocks(SeqId seq, std::span<const int32_t> computed) {
  if (!prefix_enabled_) return;
  SeqState& s = State(seq);
  const int32_t bs = block_size();
  const int32_t n_full =
      std::min<int32_t>(static_cast<int32_t>(computed.size()), s.table.num_tokens) / bs;
  for (int32_t b = s.n_hashed; b < n_full; ++b) {
    const auto block_tokens = computed.subspan(static_cast<size_t>(b) * bs, bs);
    const BlockHash h = HashBlock(s.last_hash, identity_, block_tokens);
    const BlockId id = s.table.blocks[b];
    // A block another sequence already cached under this hash stays private: same content.
    if (!prefix_.Contains(id) && prefix_.Insert(h, id, block_tokens)) {
      pool_.AddRef(id);
      if (store_ != nullptr) store_->Write(MakeRecord(h, s.last_hash, block_tokens, id));
    }
    s.last_hash = h;
  }
  s.n_hashed = std::max(s.n_hashed, n_full);
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
    ReleaseBlock(blocks[b]);
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
      Kernels().to_f16(k + int64_t{h} * d, rows + (int64_t{h} * bs + slot) * d, d);
    }
    return;
  }
  if (f.dimension_major(KVRole::kK)) {
    for (int32_t h = 0; h < n_head; ++h) {
      WriteDimensionMajor(f, k + int64_t{h} * d, d, bs, slot, KHead(s.table, pos, layer, h));
    }
    return;
  }
  for (int32_t h = 0; h < n_head; ++h) {
    const float* row = k + int64_t{h} * d;
    if (f.rotated()) {
      std::copy(row, row + d, scratch_.data());
      HadamardRotate(scratch_.data(), d);
      row = scratch_.data();
    }
    StoreRow(f.row_type(), row, KHead(s.table, pos, layer, h) + slot * layout_.k_row_bytes(), d);
  }
}

void KVCache::WriteV(SeqId seq, int32_t layer, int32_t pos, const float* v) {
  const BlockTable& t = Table(seq);
  KVLLM_CHECK(pos < t.num_tokens);
  const KVFormat f = layout_.v_format();
  const int32_t d = layout_.shape().head_dim;
  for (int32_t h = 0; h < layout_.shape().n_kv_head; ++h) {
    uint8_t* row = VRow(t, pos, layer, h);
    if (f.is_kivi()) {
      kivi::QuantizeVRow(f.bits(), v + int64_t{h} * d, row, d);
    } else {
      StoreRow(f.row_type(), v + int64_t{h} * d, row, d);
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
  const uint16_t* rows = s.staging.data() + static_cast<size_t>(layer) * n_head * bs * d;
  for (int32_t h = 0; h < n_head; ++h) {
    kivi::QuantizeKTile(f.bits(), rows + static_cast<size_t>(h) * bs * d, bs, d,
                        KHead(s.table, b * bs, layer, h), scratch_.data());
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
  const uint8_t* tile = KHead(At(t, idx), layer, head);
  if (f.is_kivi()) {
    kivi::DequantizeKSlot(f.bits(), tile, idx % bs, d, out);
    return;
  }
  if (f.dimension_major(KVRole::kK)) {
    ReadDimensionMajor(f, tile, d, bs, idx % bs, out);
    return;
  }
  DequantizeRow(f.row_type(), tile + (idx % bs) * layout_.k_row_bytes(), out, d);
  if (f.rotated()) HadamardUnrotate(out, d);
}

void KVCache::ReadV(SeqId seq, int32_t layer, int32_t head, int32_t idx, float* out) const {
  const BlockTable& t = Table(seq);
  const KVFormat f = layout_.v_format();
  const int32_t d = layout_.shape().head_dim, bs = block_size();
  const uint8_t* row = VHead(At(t, idx), layer, head) + (idx % bs) * layout_.v_row_bytes();
  if (f.is_kivi()) {
    kivi::DequantizeVRow(f.bits(), row, out, d);
  } else {
    DequantizeRow(f.row_type(), row, out, d);
  }
}

std::vector<BlockRecord> KVCache::ExportBlocks(SeqId seq, std::span<const int32_t> tokens) const {
  std::vector<BlockRecord> out;
  if (!prefix_enabled_) return out;
  const BlockTable& t = Table(seq);
  const int32_t bs = block_size();
  const int32_t n_full =
      std::min<int32_t>(static_cast<int32_t>(tokens.size()), t.num_tokens) / bs;
  BlockHash parent = 0;
  for (int32_t b = 0; b < n_full && t.blocks[b].valid(); ++b) {
    const auto block_tokens = tokens.subspan(static_cast<size_t>(b) * bs, bs);
    const BlockHash h = HashBlock(parent, identity_, block_tokens);
    out.push_back(MakeRecord(h, parent, block_tokens, t.blocks[b]));
    parent = h;
  }
  return out;
}

int32_t KVCache::ImportBlocks(const std::vector<BlockRecord>& records) {
  if (!prefix_enabled_) return 0;
  int32_t n = 0;
  BlockHash parent = 0;
  for (const BlockRecord& r : records) {
    // Only a chain from the first block can ever be found: stop at the first break.
    if (r.parent != parent || r.hash != HashBlock(parent, identity_, r.tokens) ||
        !CheckIdentity(r, block_identity()).ok()) {
      break;
    }
    if (!prefix_.Find(r.hash, r.tokens).valid() && !Load(r).valid()) break;
    parent = r.hash;
    ++n;
  }
  return n;
}

KVStats KVCache::Stats() const {
  KVStats s;
  s.bytes_per_token = layout_.bytes_per_token();
  s.bytes_per_block = layout_.bytes_per_block();
  s.block_size = block_size();
  s.blocks_total = pool_.num_blocks();
  s.blocks_free = pool_.num_free();
  s.blocks_cached_free = prefix_.num_evictable();
  s.blocks_used = blocks_used();
  // A shared block holds the most tokens any of its holders put in it.
  std::unordered_map<int32_t, int32_t> filled;
  for (const auto& [seq, state] : seqs_) {
    const BlockTable& t = state.table;
    for (size_t b = 0; b < t.blocks.size(); ++b) {
      if (!t.blocks[b].valid()) continue;
      const int32_t n =
          std::min<int32_t>(block_size(), t.num_tokens - static_cast<int32_t>(b) * block_size());
      int32_t& f = filled[t.blocks[b].value];
      f = std::max(f, n);
    }
    s.staging_bytes += state.staging.size() * sizeof(uint16_t);
  }
  for (const auto& [block, n] : filled) s.tokens_stored += n;
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
  std::string prefix_problem = prefix_.CheckIntegrity();
  if (!prefix_problem.empty()) return "prefix cache: " + prefix_problem;
  for (int32_t i = 0; i < pool_.num_blocks(); ++i) {
    const BlockId id(i);
    if (prefix_.Contains(id)) ++refs[i];
    if (prefix_.Evictable(id) != (prefix_.Contains(id) && pool_.ref_count(id) == 1)) {
      return "block " + std::to_string(i) + " is cached-free but has other holders, or the reverse";
    }
    if (refs[i] != pool_.ref_count(BlockId(i))) {
      return "block " + std::to_string(i) + ": ref count " +
             std::to_string(pool_.ref_count(BlockId(i))) + " but " + std::to_string(refs[i]) +
             " table entries";
    }
  }
  return "";
}

}  // namespace kvllm
