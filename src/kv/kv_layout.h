// KVLayout: where each K and V row lives inside a block, and what a token costs. Computed
// from the model's shape and the chosen formats only, so `kvllm kv-size` and the allocator
// agree to the byte.
//
// One block, for block_size tokens (S), n_kv_head heads (H), head_dim (D):
//
//   block ─┬─ layer 0 ─┬─ K: [H][S] rows of D elements in k_type   (k_row_bytes each)
//          │           └─ V: [H][S] rows of D elements in v_type   (v_row_bytes each)
//          ├─ layer 1 ─ ...
//          └─ layer n_layer-1
//
// A row is one token's vector for one head, so quantized formats group along head_dim.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "base/status.h"
#include "tensor/dtype.h"

namespace kvllm {

struct KVShape {
  int32_t n_layer = 0;
  int32_t n_kv_head = 0;
  int32_t head_dim = 0;
};

class KVLayout {
 public:
  // Fails when a format cannot hold rows of head_dim (e.g. q8_0 needs a multiple of 32).
  static StatusOr<KVLayout> Make(KVShape shape, int32_t block_size, DType k_type, DType v_type);

  const KVShape& shape() const { return shape_; }
  int32_t block_size() const { return block_size_; }
  DType k_type() const { return k_type_; }
  DType v_type() const { return v_type_; }
  size_t k_row_bytes() const { return k_row_bytes_; }
  size_t v_row_bytes() const { return v_row_bytes_; }

  // K and V of one token across all layers and heads.
  size_t bytes_per_token() const {
    return static_cast<size_t>(shape_.n_layer) * shape_.n_kv_head * (k_row_bytes_ + v_row_bytes_);
  }
  size_t bytes_per_block() const { return bytes_per_token() * block_size_; }

  // Byte offsets of a row from the start of its block.
  size_t KRowOffset(int32_t layer, int32_t head, int32_t slot) const {
    return layer * layer_bytes_ + (static_cast<size_t>(head) * block_size_ + slot) * k_row_bytes_;
  }
  size_t VRowOffset(int32_t layer, int32_t head, int32_t slot) const {
    return layer * layer_bytes_ + v_offset_ +
           (static_cast<size_t>(head) * block_size_ + slot) * v_row_bytes_;
  }

 private:
  KVShape shape_;
  int32_t block_size_ = 0;
  DType k_type_ = DType::kF16;
  DType v_type_ = DType::kF16;
  size_t k_row_bytes_ = 0;
  size_t v_row_bytes_ = 0;
  size_t v_offset_ = 0;     // start of the V rows within a layer
  size_t layer_bytes_ = 0;  // K + V of one layer of one block
};

}  // namespace kvllm
