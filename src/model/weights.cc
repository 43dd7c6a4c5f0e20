#include "model/weights.h"

#include <cerrno>
#include <cstring>
#include <string>

#include "tensor/quant.h"

namespace kvllm {
namespace {

std::string Shape(const gguf::TensorInfo& t) {
  std::string s = "[";
  for (uint32_t i = 0; i < t.n_dims; ++i) s += (i ? ", " : "") + std::to_string(t.ne[i]);
  return s + "]";
}

StatusOr<Matrix> BindMatrix(const gguf::GgufFile& f, const std::string& name, int64_t n_out,
                            int64_t n_in) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return Status::Error("model: tensor '" + name + "' is missing");
  if (t->n_dims != 2 || static_cast<int64_t>(t->ne[0]) != n_in ||
      static_cast<int64_t>(t->ne[1]) != n_out) {
    return Status::Error("model: tensor '" + name + "' has shape " + Shape(*t) + ", expected [" +
                         std::to_string(n_in) + ", " + std::to_string(n_out) + "]");
  }
  std::optional<DType> type = DTypeFromGgml(static_cast<uint32_t>(t->type));
  if (!type) {
    gguf::GgmlTypeTraits tr = gguf::GetGgmlTypeTraits(static_cast<uint32_t>(t->type));
    return Status::Error("model: tensor '" + name + "' has type " +
                         (tr.name ? tr.name : "?") +
                         ", which kvllm cannot compute with (supported: f32, f16, bf16, q8_0, "
                         "q4_0)");
  }
  return Matrix{*type, t->data, n_out, n_in};
}

StatusOr<const float*> BindNorm(const gguf::GgufFile& f, const std::string& name, int64_t n) {
  const gguf::TensorInfo* t = f.FindTensor(name);
  if (t == nullptr) return Status::Error("model: tensor '" + name + "' is missing");
  if (t->type != gguf::GgmlType::kF32 || t->n_elements != static_cast<uint64_t>(n)) {
    return Status::Error("model: tensor '" + name + "' must be f32 with " + std::to_string(n) +
                         " elements, found shape " + Shape(*t));
  }
  return static_cast<const float*>(t->data);
}

}  // namespace

StatusOr<Weights> Weights::Bind(const gguf::GgufFile& f, const ModelConfig& c) {
  Weights w;
  const int64_t e = c.n_embd, q = int64_t{c.n_head} * c.head_dim,
                kv = int64_t{c.n_kv_head} * c.head_dim;
  KVLLM_ASSIGN_OR_RETURN(w.token_embd, BindMatrix(f, "token_embd.weight", c.n_vocab, e));
  KVLLM_ASSIGN_OR_RETURN(w.output_norm, BindNorm(f, "output_norm.weight", e));
  w.tied_output = f.FindTensor("output.weight") == nullptr;
  if (w.tied_output) {
    w.output = w.token_embd;
  } else {
    KVLLM_ASSIGN_OR_RETURN(w.output, BindMatrix(f, "output.weight", c.n_vocab, e));
  }
  w.layers.resize(c.n_layer);
  for (int32_t i = 0; i < c.n_layer; ++i) {
    const std::string b = "blk." + std::to_string(i) + ".";
    LayerWeights& l = w.layers[i];
    KVLLM_ASSIGN_OR_RETURN(l.attn_norm, BindNorm(f, b + "attn_norm.weight", e));
    KVLLM_ASSIGN_OR_RETURN(l.wq, BindMatrix(f, b + "attn_q.weight", q, e));
    KVLLM_ASSIGN_OR_RETURN(l.wk, BindMatrix(f, b + "attn_k.weight", kv, e));
    KVLLM_ASSIGN_OR_RETURN(l.wv, BindMatrix(f, b + "attn_v.weight", kv, e));
    KVLLM_ASSIGN_OR_RETURN(l.wo, BindMatrix(f, b + "attn_output.weight", e, q));
    KVLLM_ASSIGN_OR_RETURN(l.ffn_norm, BindNorm(f, b + "ffn_norm.weight", e));
    KVLLM_ASSIGN_OR_RETURN(l.w_gate, BindMatrix(f, b + "ffn_gate.weight", c.n_ff, e));
    KVLLM_ASSIGN_OR_RETURN(l.w_up, BindMatrix(f, b + "ffn_up.weight", c.n_ff, e));
    KVLLM_ASSIGN_OR_RETURN(l.w_down, BindMatrix(f, b + "ffn_down.weight", e, c.n_ff));
  }
  return w;
}

Status Weights::Interleave(gguf::GgufFile& file) {
  std::vector<Matrix*> moved;
  for (LayerWeights& l : layers) {
    for (Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      moved.push_back(m);
    }
  }
  if (!tied_output) moved.push_back(&output);
  std::erase_if(moved, [](const Matrix* m) {
    return !PrefersInterleaved(m->type, m->n_out, m->n_in);
  });
  size_t total = 0;
  for (const Matrix* m : moved) total += m->bytes();
  if (total == 0) return Status::Ok();
  interleaved = HugePageBuffer::Allocate(total);
  if (interleaved.data() == nullptr) {
    return Status::Error("model: cannot allocate " + std::to_string(total >> 20) +
                         " MiB for the interleaved weights: " + std::strerror(errno));
  }
  uint8_t* next = interleaved.data();
  for (Matrix* m : moved) {
    InterleaveRows(m->type, m->data, m->n_out, m->n_in, next);
    file.Discard(m->data, m->bytes());
    m->data = next;
    m->layout = WeightLayout::kInterleaved16;
    next += m->bytes();
  }
  interleaved.MakeReadOnly();
  return Status::Ok();
}

size_t Weights::DecodeBytes() const {
  size_t total = output.bytes();
  for (const LayerWeights& l : layers) {
    for (const Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      total += m->bytes();
    }
  }
  return total;
}

}  // namespace kvllm
