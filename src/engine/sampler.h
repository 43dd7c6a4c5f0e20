// Sampler: turns a row of logits into a token. Applies, in llama.cpp's order, the repetition
// penalty, top-k, top-p, min-p, then temperature and a seeded draw; temperature <= 0 is greedy
// (argmax, ties broken by the lowest id). A Sampler owns its RNG, so two samplers with the same
// seed and inputs produce the same tokens.
#pragma once

#include <cstdint>
#include <random>
#include <vector>

namespace kvllm {

struct SamplingParams {
  float temperature = 0.8f;
  int32_t top_k = 40;        // <= 0: off
  float top_p = 0.95f;       // >= 1: off
  float min_p = 0.05f;       // <= 0: off
  float repeat_penalty = 1.0f;  // 1: off
  int32_t repeat_last_n = 64;   // how many recent tokens the penalty looks at
  uint64_t seed = 0xFFFFFFFFu;  // kRandomSeed: seed from the clock
  static constexpr uint64_t kRandomSeed = 0xFFFFFFFFu;
};

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // `logits`: [n_vocab]; `recent`: the sequence's tokens so far (for the repetition penalty).
  // Scratch is reused across calls; only the first call allocates.
  int32_t Sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& recent);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  std::mt19937_64 rng_;
  std::vector<std::pair<float, int32_t>> candidates_;  // (logit or prob, id) scratch
};

}  // namespace kvllm
