// Weights: the model's tensors bound in place to the mmap'd GGUF file (never copied), with
// their shapes checked against the ModelConfig. Names are llama.cpp's.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"
#include "tensor/dtype.h"

namespace kvllm {

// A row-major matrix W[n_out][n_in] stored in `type` (rows are RowBytes(type, n_in) apart).
struct Matrix {
  DType type = DType::kF32;
  const void* data = nullptr;
  int64_t n_out = 0;
  int64_t n_in = 0;

  size_t row_bytes() const { return RowBytes(type, n_in); }
  const void* Row(int64_t i) const {
    return static_cast<const uint8_t*>(data) + static_cast<size_t>(i) * row_bytes();
  }
  size_t bytes() const { return static_cast<size_t>(n_out) * row_bytes(); }
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

  static StatusOr<Weights> Bind(const gguf::GgufFile& file, const ModelConfig& config);
  // Bytes of all matrices read by one decode step (the embedding row is negligible).
  size_t DecodeBytes() const;
};

}  // namespace kvllm
