#include "model/model_config.h"

#include <limits>

namespace kvllm {
namespace {

// Reads an unsigned hyper-parameter that must fit an int32 and be positive.
StatusOr<int32_t> GetDim(const gguf::GgufFile& f, const std::string& key,
                         std::optional<int32_t> fallback = std::nullopt) {
  StatusOr<uint64_t> v = fallback ? f.GetUint(key, static_cast<uint64_t>(*fallback))
                                  : f.GetUint(key);
  if (!v.ok()) return v.status();
  if (*v == 0 || *v > static_cast<uint64_t>(std::numeric_limits<int32_t>::max())) {
    return Status::Error("model: " + key + " = " + std::to_string(*v) + " is out of range");
  }
  return static_cast<int32_t>(*v);
}

}  // namespace

StatusOr<ModelConfig> ModelConfig::FromGguf(const gguf::GgufFile& f) {
  ModelConfig c;
  auto arch = f.GetString("general.architecture");
  if (!arch.ok()) return arch.status();
  c.arch = *arch;
  // Architectures whose tensors and forward are exactly Llama's.
  if (c.arch != "llama" && c.arch != "mistral") {
    return Status::Error("model: architecture '" + c.arch +
                         "' is not supported (supported: llama, mistral)");
  }
  auto name = f.GetString("general.name");
  if (name.ok()) c.name = *name;
  const std::string p = c.arch + ".";

  KVLLM_ASSIGN_OR_RETURN(c.n_embd, GetDim(f, p + "embedding_length"));
  KVLLM_ASSIGN_OR_RETURN(c.n_layer, GetDim(f, p + "block_count"));
  KVLLM_ASSIGN_OR_RETURN(c.n_ff, GetDim(f, p + "feed_forward_length"));
  KVLLM_ASSIGN_OR_RETURN(c.n_head, GetDim(f, p + "attention.head_count"));
  KVLLM_ASSIGN_OR_RETURN(c.n_kv_head, GetDim(f, p + "attention.head_count_kv", c.n_head));
  KVLLM_ASSIGN_OR_RETURN(c.n_ctx_train, GetDim(f, p + "context_length", 2048));
  if (c.n_embd % c.n_head != 0) {
    return Status::Error("model: embedding_length " + std::to_string(c.n_embd) +
                         " is not a multiple of head_count " + std::to_string(c.n_head));
  }
  c.head_dim = c.n_embd / c.n_head;
  if (c.n_head % c.n_kv_head != 0) {
    return Status::Error("model: head_count " + std::to_string(c.n_head) +
                         " is not a multiple of head_count_kv " + std::to_string(c.n_kv_head));
  }
  KVLLM_ASSIGN_OR_RETURN(c.n_rot, GetDim(f, p + "rope.dimension_count", c.head_dim));
  if (c.n_rot > c.head_dim || c.n_rot % 2 != 0) {
    return Status::Error("model: rope.dimension_count " + std::to_string(c.n_rot) +
                         " must be even and at most head_dim " + std::to_string(c.head_dim));
  }
  double eps = 0, base = 0;
  KVLLM_ASSIGN_OR_RETURN(eps, f.GetFloat(p + "attention.layer_norm_rms_epsilon", 1e-5));
  KVLLM_ASSIGN_OR_RETURN(base, f.GetFloat(p + "rope.freq_base", 10000.0));
  if (!(eps > 0) || !(base > 0)) {
    return Status::Error("model: rms epsilon and rope freq_base must be positive");
  }
  c.rms_eps = static_cast<float>(eps);
  c.rope_base = static_cast<float>(base);

  uint64_t window = 0;
  KVLLM_ASSIGN_OR_RETURN(window, f.GetUint(p + "attention.sliding_window", 0));
  if (window > uint64_t{std::numeric_limits<int32_t>::max()}) {
    return Status::Error("model: attention.sliding_window is out of range");
  }
  c.sliding_window = static_cast<int32_t>(window);

  const gguf::TensorInfo* embd = f.FindTensor("token_embd.weight");
  if (embd == nullptr) return Status::Error("model: tensor 'token_embd.weight' is missing");
  if (embd->ne[1] == 0 || embd->ne[1] > uint64_t{std::numeric_limits<int32_t>::max()}) {
    return Status::Error("model: token_embd.weight has an invalid vocabulary size");
  }
  KVLLM_ASSIGN_OR_RETURN(c.n_vocab, GetDim(f, p + "vocab_size", static_cast<int32_t>(embd->ne[1])));
  return c;
}

int64_t ModelConfig::ParamCount(bool tied_output) const {
  const int64_t e = n_embd, q = int64_t{n_head} * head_dim, kv = int64_t{n_kv_head} * head_dim;
  const int64_t per_layer = 2 * e + e * q + 2 * e * kv + q * e + 3 * e * n_ff;
  return int64_t{n_vocab} * e * (tied_output ? 1 : 2) + e + n_layer * per_layer;
}

}  // namespace kvllm
