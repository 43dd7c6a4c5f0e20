#include "kv/kv_layout.h"

namespace kvllm {

StatusOr<KVLayout> KVLayout::Make(KVShape shape, int32_t block_size, DType k_type,
                                  DType v_type) {
  if (shape.n_layer <= 0 || shape.n_kv_head <= 0 || shape.head_dim <= 0) {
    return Status::Error("kv: invalid shape (layers, kv heads and head_dim must be positive)");
  }
  if (block_size <= 0) return Status::Error("kv: --block-size must be positive");
  for (DType t : {k_type, v_type}) {
    if (shape.head_dim % BlockElems(t) != 0) {
      return Status::Error(std::string("kv: format ") + DTypeName(t) + " needs head_dim (" +
                           std::to_string(shape.head_dim) + ") to be a multiple of " +
                           std::to_string(BlockElems(t)));
    }
  }
  KVLayout l;
  l.shape_ = shape;
  l.block_size_ = block_size;
  l.k_type_ = k_type;
  l.v_type_ = v_type;
  l.k_row_bytes_ = RowBytes(k_type, shape.head_dim);
  l.v_row_bytes_ = RowBytes(v_type, shape.head_dim);
  l.v_offset_ = static_cast<size_t>(shape.n_kv_head) * block_size * l.k_row_bytes_;
  l.layer_bytes_ = l.v_offset_ + static_cast<size_t>(shape.n_kv_head) * block_size * l.v_row_bytes_;
  return l;
}

}  // namespace kvllm
