// Element types kvllm computes with. Numbering and block layouts are GGUF's (ggml's), so
// weights written by other tools are read in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvllm {

enum class DType : uint32_t {
  kF32 = 0,
  kF16 = 1,
  kQ4_0 = 2,
  kQ8_0 = 8,
  kBF16 = 30,
};

constexpr int kQK = 32;  // elements per Q8_0 / Q4_0 block

// Elements per block (1 for plain float types, 32 for Q8_0/Q4_0).
int BlockElems(DType t);
// Bytes per block.
size_t BlockBytes(DType t);
// Bytes of a row of n elements; n must be a multiple of BlockElems(t).
size_t RowBytes(DType t, int64_t n);
const char* DTypeName(DType t);                        // "f32", "f16", "q8_0", ...
std::optional<DType> DTypeFromName(std::string_view);  // inverse of DTypeName
std::optional<DType> DTypeFromGgml(uint32_t ggml_type);

}  // namespace kvllm
