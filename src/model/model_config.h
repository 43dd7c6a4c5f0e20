// ModelConfig: the hyper-parameters of a Llama-family model, read from GGUF metadata
// (`<arch>.*` keys, llama.cpp's names) and validated so that the forward pass can trust them.
#pragma once

#include <cstdint>
#include <string>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvllm {

struct ModelConfig {
  std::string arch;         // general.architecture
  std::string name;         // general.name (may be empty)
  int32_t n_vocab = 0;
  int32_t n_ctx_train = 0;  // <arch>.context_length
  int32_t n_embd = 0;       // <arch>.embedding_length
  int32_t n_layer = 0;      // <arch>.block_count
  int32_t n_ff = 0;         // <arch>.feed_forward_length
  int32_t n_head = 0;       // <arch>.attention.head_count
  int32_t n_kv_head = 0;    // <arch>.attention.head_count_kv (defaults to n_head)
  int32_t head_dim = 0;     // n_embd / n_head
  int32_t n_rot = 0;        // <arch>.rope.dimension_count (defaults to head_dim)
  float rms_eps = 1e-5f;    // <arch>.attention.layer_norm_rms_epsilon
  float rope_base = 10000;  // <arch>.rope.freq_base
  int32_t sliding_window = 0;  // <arch>.attention.sliding_window (0: full attention)

  // n_vocab comes from <arch>.vocab_size or, when absent, the token embedding's rows.
  static StatusOr<ModelConfig> FromGguf(const gguf::GgufFile& file);

  int32_t n_group() const { return n_head / n_kv_head; }
  // Parameters in the weight matrices and norms (embedding counted once when tied).
  int64_t ParamCount(bool tied_output) const;
};

}  // namespace kvllm
