#include "cli/bench_roofline.h"

#include <algorithm>

#include "kv/attention.h"
#include "tensor/quant.h"

namespace kvllm::cli {

double TokenCosts::DecodeBytes(double context) const {
  if (max_context > 0) context = std::min(context, static_cast<double>(max_context));
  return weight_bytes + kv_bytes_per_token * context;
}

double TokenCosts::DecodeSeconds(double context, double bandwidth, double fma_peak,
                                 double int8_peak) const {
  if (max_context > 0) context = std::min(context, static_cast<double>(max_context));
  const double read = kv_bytes_per_token * context / bandwidth;
  if (fma_peak <= 0) return weight_bytes / bandwidth + read;
  if (int8_peak <= 0) int8_peak = fma_peak;
  const double ops = attention_flops_per_pair * context;
  const double float_share = 1 - attention_int8_share - attention_int16_share;
  const double arithmetic = ops * float_share / fma_peak + ops * attention_int8_share / int8_peak +
                            ops * attention_int16_share / (int8_peak / 2);
  return weight_bytes / bandwidth + std::max(read, arithmetic);
}

double TokenCosts::PrefillFlopsPerToken(int64_t n_prompt) const {
  const double n = static_cast<double>(std::max<int64_t>(n_prompt, 1));
  // sum over i < n of min(i + 1, max_context), divided by n.
  double mean_context = (n + 1) / 2;
  if (max_context > 0 && n > max_context) {
    const double w = static_cast<double>(max_context);
    mean_context = (w * (w + 1) / 2 + (n - w) * w) / n;
  }
  return layer_matmul_flops + layer_int8_ops + (output_flops + output_int8_ops) / n +
         attention_flops_per_pair * mean_context;
}

double TokenCosts::PrefillInt8OpsPerToken(int64_t n_prompt) const {
  const double n = static_cast<double>(std::max<int64_t>(n_prompt, 1));
  return layer_int8_ops + output_int8_ops / n;
}

double TokenCosts::PrefillSecondsPerToken(int64_t n_prompt, double fma_peak,
                                          double int8_peak) const {
  if (int8_peak <= 0) int8_peak = fma_peak;
  const double int8 = PrefillInt8OpsPerToken(n_prompt);
  return (PrefillFlopsPerToken(n_prompt) - int8) / fma_peak + int8 / int8_peak;
}

TokenCosts ComputeTokenCosts(const Model& model, const KVLayout& layout, int32_t kv_window,
                             int32_t kv_sinks) {
  const ModelConfig& c = model.config();
  const Weights& w = model.weights();
  TokenCosts t;
  const double norms = (2.0 * c.n_layer + 1) * c.n_embd * sizeof(float);
  t.weight_bytes = static_cast<double>(w.DecodeBytes()) + norms +
                   static_cast<double>(w.token_embd.row_bytes());
  t.kv_bytes_per_token = static_cast<double>(layout.bytes_per_token());
  t.max_context = kv_window > 0 ? int64_t{kv_window} + kv_sinks : 0;
  const auto ops = [](const Matrix& m) {
    return 2.0 * static_cast<double>(m.n_out) * static_cast<double>(m.n_in);
  };
  for (const LayerWeights& l : w.layers) {
    for (const Matrix* m : {&l.wq, &l.wk, &l.wv, &l.wo, &l.w_gate, &l.w_up, &l.w_down}) {
      (UsesQ8Activations(m->type) ? t.layer_int8_ops : t.layer_matmul_flops) += ops(*m);
    }
  }
  (UsesQ8Activations(w.output.type) ? t.output_int8_ops : t.output_flops) += ops(w.output);
  t.attention_flops_per_pair = 4.0 * c.n_layer * c.n_head * c.head_dim;
  t.attention_int8_share = AttentionQuantizesQuery(layout.k_format()) ? 0.5 : 0.0;
  t.attention_int16_share = AttentionWeighsVInIntegers(layout.v_format()) ? 0.5 : 0.0;
  return t;
}

}  // namespace kvllm::cli
