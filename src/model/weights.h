// Weights: the model's tensors bound in place to the mmap'd GGUF file, with their shapes checked
// against the ModelConfig, and the matrices the kernels read faster interleaved copied out of
// it once, 16 rows at a time. Names are llama.cpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/huge_pages.h"
#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"

namespace kvllm {

// A matrix W[n_out][n_in] stored in `type`, row after row (rows RowBytes(type, n_in) apart) or
// interleaved 16 rows at a time (the same bytes in all).
struct Matrix {
  DType type = DType::kF32;
  const void* data = nullptr;
  int64_t n_out = 0;
  int64_t n_in = 0;
  WeightLayout layout = WeightLayout::kRows;

  size_t row_bytes() const { return RowBytes(type, n_in); }
  // Row i, of a matrix stored row after row.
  const void* Row(int64_t i) const {
    KVLLM_CHECK(layout == WeightLayout::kRows);
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(i) * row_bytes();
  }
  size_t bytes() const { return static_cast<size_t>(n_out) * row_bytes(); }
  // This matrix's part of a MatMulShared call, its product into y.
  MatMulOut Product(float* y) const { return {type, data, n_out, y, layout}; }
};

struct LayerWeights {
  const float* attn_norm;  // [n_embd]
  Matrix wq;               // [n_head*head_dim][n_embd]
  Matrix wk;               // [n_kv_head*head_dim][n_embd]
  Matrix wv;               // [n_kv_head*head_dim][n_embd]
  Matrix wo;               // [n_embd][n_head*head_dim]
  const float* ffn_norm;   // [n_embd]
  Matrix w_gate;           // [n_ff][n_embd]
  Matrix w_up;             // [n_ff][n_embd]
  Matrix w_down;           // [n_embd][n_ff]
};

struct Weights {
  Matrix token_embd;         // [n_vocab][n_embd]
  const float* output_norm;  // [n_embd]
  Matrix output;             // [n_vocab][n_embd]; the same tensor as token_embd when tied
  bool tied_output = false;  // output.weight absent: logits use the token embedding
  std::vector<LayerWeights> layers;
  HugePageBuffer interleaved;  // what Interleave copied

  static StatusOr<Weights> Bind(const gguf::GgufFile& file, const ModelConfig& config);
  // Copies every layer matrix and the output matrix (unless it is the embedding) for which
  // PrefersInterleaved holds into memory of its own, interleaved, and discards the file's
  // copy. Does nothing where the kernels prefer rows.
  Status Interleave(gguf::GgufFile& file);
  // Bytes of all matrices read by one decode step (the embedding row is negligible).
  size_t DecodeBytes() const;
};

}  // namespace kvllm
