#include "kv/kv_format.h"

#include <string>

#include "kv/hadamard.h"
#include "kv/kivi.h"

namespace kvllm {
namespace {

constexpr KVFormat kFormats[] = {DType::kF32,  DType::kF16,           DType::kBF16,
                                 DType::kQ8_0, DType::kQ4_0,          KVFormat::RotatedQ4_0(),
                                 KVFormat::Kivi(4), KVFormat::Kivi(2)};

}  // namespace

std::optional<KVFormat> KVFormat::FromName(std::string_view name) {
  for (KVFormat f : kFormats) {
    if (name == f.name()) return f;
  }
  return std::nullopt;
}

std::span<const KVFormat> KVFormat::All() { return kFormats; }

const char* KVFormat::name() const {
  if (is_kivi()) return bits_ == 4 ? "k4" : "k2";
  if (rotated_) return "q4_0r";
  return DTypeName(type_);
}

const char* KVFormatNames() { return "f32, f16, bf16, q8_0, q4_0, q4_0r (K only), k4, k2"; }

Status KVFormat::Validate(KVRole role, int32_t head_dim) const {
  const std::string what = std::string("kv: format ") + name() + " needs head_dim (" +
                           std::to_string(head_dim) + ") to be ";
  if (is_kivi()) {
    if (head_dim % kivi::kGroup != 0) {
      return Status::Error(what + "a multiple of " + std::to_string(kivi::kGroup));
    }
    return Status::Ok();
  }
  if (rotated_) {
    if (role != KVRole::kK) {
      return Status::Error(std::string("kv: ") + name() +
                           " is a K format (the rotated query undoes its rotation); use " +
                           DTypeName(type_) + " for V");
    }
    if (!IsPowerOfTwo(head_dim)) {
      return Status::Error(what + "a power of two (Walsh-Hadamard rotation)");
    }
  }
  if (head_dim % BlockElems(type_) != 0) {
    return Status::Error(what + "a multiple of " + std::to_string(BlockElems(type_)));
  }
  return Status::Ok();
}

size_t KVFormat::HeadBytesPerBlock(KVRole role, int32_t block_size, int32_t head_dim) const {
  if (staged(role)) return kivi::KTileBytes(bits_, block_size, head_dim);
  return block_size * RowBytes(role, head_dim);
}

size_t KVFormat::RowBytes(KVRole role, int32_t head_dim) const {
  KVLLM_CHECK(!staged(role));
  if (is_kivi()) return kivi::VRowBytes(bits_, head_dim);
  return ::kvllm::RowBytes(type_, head_dim);
}

}  // namespace kvllm
