// KVFormat: how the cache stores K or V. K and V each have their own format.
//
//   name    kind        storage
//   f32     row         a token's head_dim vector as a row of that DType (tensor/dtype.h)
//   f16     row         (as K: dimension-major within a block, see dimension_major())
//   bf16    row
//   q8_0    row         groups of 32 with an f16 scale (GGUF's Q8_0; as K: dimension-major)
//   q4_0    row         groups of 32 with an f16 scale (GGUF's Q4_0)
//   q4_0r   row, K only q4_0 of the K row after a fixed random-sign Walsh-Hadamard rotation
//                       (QuaRot); the query is rotated the same way before the dot, so q·k
//                       is unchanged while outlier channels are spread over the whole row.
//                       Needs head_dim a power of two.
//   k4, k2  kivi        KIVI (Liu et al. 2024), asymmetric b-bit integers with an f16 scale
//                       and minimum: K per channel across a block's tokens (the block being
//                       filled waits in f16 in a per-sequence staging area), V per token in
//                       groups of 32. Needs head_dim a multiple of 32. See kivi.h.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "base/status.h"
#include "tensor/dtype.h"

namespace kvllm {

enum class KVRole : uint8_t { kK, kV };

class KVFormat {
 public:
  // Every row DType is a format of its own name, so a DType converts implicitly.
  constexpr KVFormat(DType t) : type_(t) {}  // NOLINT(google-explicit-constructor)
  static constexpr KVFormat RotatedQ4_0() { return KVFormat(DType::kQ4_0, 0, true); }
  static constexpr KVFormat Kivi(int bits) { return KVFormat(DType::kF16, bits, false); }

  static std::optional<KVFormat> FromName(std::string_view name);
  // Every format, in the order `kvllm kv-size` lists them.
  static std::span<const KVFormat> All();

  const char* name() const;
  bool is_kivi() const { return bits_ != 0; }
  int bits() const { return bits_; }  // 4 or 2 for KIVI formats, 0 otherwise
  bool rotated() const { return rotated_; }
  // The DType of a row format's rows (meaningless for KIVI formats).
  DType row_type() const { return type_; }
  // An f16 or Q8_0 K is stored dimension-major within each block: per layer and head, f16
  // [head_dim][block_size], Q8_0 as Q8DimsLayout (tensor/quant.h); a token's values are
  // block_size apart. Attention then takes one dimension of many tokens per vector and its
  // scores need no horizontal sums (Kernels().scores_f16t, scores_q8t).
  bool dimension_major(KVRole role) const {
    return role == KVRole::kK && bits_ == 0 && !rotated_ &&
           (type_ == DType::kF16 || type_ == DType::kQ8_0);
  }
  // K waits in f16 until its block is full (KIVI's per-channel quantization).
  bool staged(KVRole role) const { return role == KVRole::kK && is_kivi(); }

  // Fails when the format cannot hold heads of `head_dim` in this role.
  Status Validate(KVRole role, int32_t head_dim) const;

  // Bytes one (layer, kv head) takes in one block of `block_size` tokens; requires Validate.
  size_t HeadBytesPerBlock(KVRole role, int32_t block_size, int32_t head_dim) const;
  // Bytes of one token's row where the format stores one row per token, which is every
  // (format, role) but a KIVI K (a block's K is stored together); requires Validate.
  size_t RowBytes(KVRole role, int32_t head_dim) const;

  friend constexpr bool operator==(KVFormat a, KVFormat b) {
    return a.type_ == b.type_ && a.bits_ == b.bits_ && a.rotated_ == b.rotated_;
  }

 private:
  constexpr KVFormat(DType t, int8_t bits, bool rotated)
      : type_(t), bits_(bits), rotated_(rotated) {}

  DType type_;
  int8_t bits_ = 0;
  bool rotated_ = false;
};

// "f32, f16, bf16, q8_0, q4_0, q4_0r, k4, k2" (for help texts and errors).
const char* KVFormatNames();

}  // namespace kvllm
