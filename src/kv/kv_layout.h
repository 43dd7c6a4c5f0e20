// KVLayout: where each K and V head lives inside a block, and what a token costs. Computed
// from the model's shape and the chosen formats only, so `kvllm kv-size` and the allocator
// agree to the byte.
//
// One block, for block_size tokens (S), n_kv_head heads (H), head_dim (D), as a block record
// holds it (the pool keeps each head's tile of all blocks together instead; see KVCache):
//
//   block ─┬─ layer 0 ─┬─ K: [H] head tiles of k_head_bytes
//          │           │      row formats: [S] rows of D elements (k_row_bytes each)
//          │           │      KIVI:        per-channel scales and S rows of codes (kivi.h)
//          │           └─ V: [H][S] rows of D elements in v_format   (v_row_bytes each)
//          ├─ layer 1 ─ ...
//          └─ layer n_layer-1
//
// A row is one token's vector for one head, so quantized row formats group along head_dim.
// A KIVI K quantizes each channel over the block's tokens, so its block is quantized once,
// when full; until then that block's K waits in f16 in its sequence's staging area
// (staging_bytes_per_sequence, outside the pool).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "kv/kv_format.h"

namespace kvllm {

struct KVShape {
  int32_t n_layer = 0;
  int32_t n_kv_head = 0;
  int32_t head_dim = 0;
};

class KVLayout {
 public:
  // Fails when a format cannot hold heads of head_dim (e.g. q8_0 needs a multiple of 32).
  static StatusOr<KVLayout> Make(KVShape shape, int32_t block_size, KVFormat k_format,
                                 KVFormat v_format);

  const KVShape& shape() const { return shape_; }
  int32_t block_size() const { return block_size_; }
  KVFormat k_format() const { return k_format_; }
  KVFormat v_format() const { return v_format_; }
  size_t k_head_bytes() const { return k_head_bytes_; }  // one head's K in one block
  size_t k_row_bytes() const { return k_row_bytes_; }    // 0 for a KIVI K (no rows)
  size_t v_row_bytes() const { return v_row_bytes_; }
  size_t v_head_bytes() const { return static_cast<size_t>(block_size_) * v_row_bytes_; }

  size_t bytes_per_block() const { return static_cast<size_t>(shape_.n_layer) * layer_bytes_; }
  // K and V of one token across all layers and heads: bytes_per_block / block_size, rounded
  // up (exact unless a KIVI K's per-block scales do not divide evenly over block_size).
  size_t bytes_per_token() const { return (bytes_per_block() + block_size_ - 1) / block_size_; }
  // The f16 K of one block per sequence while it fills (KIVI K only; 0 otherwise).
  size_t staging_bytes_per_sequence() const {
    return k_format_.staged(KVRole::kK)
               ? static_cast<size_t>(shape_.n_layer) * shape_.n_kv_head * block_size_ *
                     shape_.head_dim * sizeof(uint16_t)
               : 0;
  }

  // Byte offsets from the start of a block record.
  size_t KHeadOffset(int32_t layer, int32_t head) const {
    return layer * layer_bytes_ + head * k_head_bytes_;
  }
  size_t VHeadOffset(int32_t layer, int32_t head) const {
    return layer * layer_bytes_ + v_offset_ + head * v_head_bytes();
  }
  // Calls fn(offset, bytes) for each head's K tile and V rows of a block, in record order;
  // together they cover the block's bytes_per_block.
  template <class Fn>
  void ForEachHeadTile(const Fn& fn) const {
    for (int32_t layer = 0; layer < shape_.n_layer; ++layer) {
      for (int32_t h = 0; h < shape_.n_kv_head; ++h) fn(KHeadOffset(layer, h), k_head_bytes_);
      for (int32_t h = 0; h < shape_.n_kv_head; ++h) fn(VHeadOffset(layer, h), v_head_bytes());
    }
  }

 private:
  KVShape shape_;
  int32_t block_size_ = 0;
  KVFormat k_format_ = DType::kF16;
  KVFormat v_format_ = DType::kF16;
  size_t k_head_bytes_ = 0;
  size_t k_row_bytes_ = 0;  // 0 for a KIVI K
  size_t v_row_bytes_ = 0;
  size_t v_offset_ = 0;     // start of the V rows within a layer
  size_t layer_bytes_ = 0;  // K + V of one layer of one block
};

}  // namespace kvllm
