#include "tensor/dtype.h"

#include "base/status.h"
#include "tensor/quant.h"

namespace kvllm {

int BlockElems(DType t) {
  switch (t) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
      return 1;
    case DType::kQ8_0:
    case DType::kQ4_0:
      return kQK;
  }
  CheckFailed("unknown DType", __FILE__, __LINE__);
}

size_t BlockBytes(DType t) {
  switch (t) {
    case DType::kF32:
      return sizeof(float);
    case DType::kF16:
    case DType::kBF16:
      return sizeof(uint16_t);
    case DType::kQ8_0:
      return sizeof(BlockQ8_0);
    case DType::kQ4_0:
      return sizeof(BlockQ4_0);
  }
  CheckFailed("unknown DType", __FILE__, __LINE__);
}

size_t RowBytes(DType t, int64_t n) {
  const int block = BlockElems(t);
  KVLLM_CHECK(n >= 0 && n % block == 0);
  return static_cast<size_t>(n / block) * BlockBytes(t);
}

const char* DTypeName(DType t) {
  switch (t) {
    case DType::kF32:
      return "f32";
    case DType::kF16:
      return "f16";
    case DType::kBF16:
      return "bf16";
    case DType::kQ8_0:
      return "q8_0";
    case DType::kQ4_0:
      return "q4_0";
  }
  return "unknown";
}

std::optional<DType> DTypeFromName(std::string_view name) {
  for (DType t : {DType::kF32, DType::kF16, DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    if (name == DTypeName(t)) return t;
  }
  return std::nullopt;
}

std::optional<DType> DTypeFromGgml(uint32_t ggml_type) {
  // The enum values are ggml's type numbers, so a known number converts as is.
  switch (static_cast<DType>(ggml_type)) {
    case DType::kF32:
    case DType::kF16:
    case DType::kBF16:
    case DType::kQ8_0:
    case DType::kQ4_0:
      return static_cast<DType>(ggml_type);
  }
  return std::nullopt;
}

}  // namespace kvllm
