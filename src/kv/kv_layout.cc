#include "kv/kv_layout.h"

namespace kvllm {

StatusOr<KVLayout> KVLayout::Make(KVShape shape, int32_t block_size, KVFormat k_format,
                                  KVFormat v_format) {
  if (shape.n_layer <= 0 || shape.n_kv_head <= 0 || shape.head_dim <= 0) {
    return Status::Error("kv: invalid shape (layers, kv heads and head_dim must be positive)");
  }
  if (block_size <= 0) return Status::Error("kv: --block-size must be positive");
  KVLLM_RETURN_IF_ERROR(k_format.Validate(KVRole::kK, shape.head_dim));
  KVLLM_RETURN_IF_ERROR(v_format.Validate(KVRole::kV, shape.head_dim));
  KVLayout l;
  l.shape_ = shape;
  l.block_size_ = block_size;
  l.k_format_ = k_format;
  l.v_format_ = v_format;
  l.k_head_bytes_ = k_format.HeadBytesPerBlock(KVRole::kK, block_size, shape.head_dim);
  l.k_row_bytes_ =
      k_format.staged(KVRole::kK) ? 0 : k_format.RowBytes(KVRole::kK, shape.head_dim);
  l.v_row_bytes_ = v_format.RowBytes(KVRole::kV, shape.head_dim);
  l.v_offset_ = static_cast<size_t>(shape.n_kv_head) * l.k_head_bytes_;
  l.layer_bytes_ = l.v_offset_ + static_cast<size_t>(shape.n_kv_head) * block_size * l.v_row_bytes_;
  return l;
}

}  // namespace kvllm
