#include "engine/sampler.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstddef>

#include "base/status.h"

namespace kvllm {
namespace {

uint64_t ResolveSeed(uint64_t seed) {
  if (seed != SamplingParams::kRandomSeed) return seed;
  // The clock covers platforms whose random_device is deterministic.
  std::random_device device;
  const uint64_t entropy = (static_cast<uint64_t>(device()) << 32) | device();
  const auto now = std::chrono::steady_clock::now().time_since_epoch().count();
  return entropy ^ static_cast<uint64_t>(now);
}

// Larger logit first; equal logits by lower id, so every order below is deterministic.
bool ByLogitDescending(const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
  if (a.first != b.first) return a.first > b.first;
  return a.second < b.second;
}

}  // namespace

Sampler::Sampler(const SamplingParams& params)
    : params_(params), rng_(ResolveSeed(params.seed)) {}

int32_t Sampler::Sample(const float* logits, int32_t n_vocab, const std::vector<int32_t>& recent) {
  KVLLM_CHECK(n_vocab > 0);
  candidates_.resize(n_vocab);
  for (int32_t id = 0; id < n_vocab; ++id) candidates_[id] = {logits[id], id};

  // llama.cpp's penalty: shrink positive logits, grow negative ones. Each penalized value is
  // computed from the original logit, so a token that occurs several times is penalized once.
  const float penalty = params_.repeat_penalty;
  if (penalty != 1.0f && params_.repeat_last_n != 0) {
    const size_t window = params_.repeat_last_n < 0
                              ? recent.size()
                              : std::min(recent.size(), static_cast<size_t>(params_.repeat_last_n));
    for (size_t i = recent.size() - window; i < recent.size(); ++i) {
      const int32_t id = recent[i];
      if (id < 0 || id >= n_vocab) continue;
      candidates_[id].first = logits[id] > 0 ? logits[id] / penalty : logits[id] * penalty;
    }
  }

  if (params_.temperature <= 0.0f) {
    // Candidates are in id order, so keeping the first maximum breaks ties by lowest id.
    size_t best = 0;
    for (size_t i = 1; i < candidates_.size(); ++i) {
      if (candidates_[i].first > candidates_[best].first) best = i;
    }
    return candidates_[best].second;
  }

  const auto begin = candidates_.begin();
  auto end = candidates_.end();
  bool sorted = false;
  if (params_.top_k > 0 && params_.top_k < n_vocab) {
    // Only the k survivors are ordered: O(n log k) instead of sorting the whole vocabulary.
    std::partial_sort(begin, begin + params_.top_k, end, ByLogitDescending);
    end = begin + params_.top_k;
    sorted = true;
  }

  // top-p and min-p judge probabilities at temperature 1, as llama.cpp does when temperature
  // comes last in the chain.
  if (params_.top_p < 1.0f) {
    if (!sorted) std::sort(begin, end, ByLogitDescending);
    sorted = true;
    const float max_logit = begin->first;
    double total = 0;
    for (auto it = begin; it != end; ++it) {
      total += std::exp(static_cast<double>(it->first - max_logit));
    }
    // Keep the smallest prefix whose probability mass reaches top_p (at least one token).
    const double target = static_cast<double>(params_.top_p) * total;
    double mass = 0;
    auto cut = begin;
    while (cut != end) {
      mass += std::exp(static_cast<double>(cut->first - max_logit));
      ++cut;
      if (mass >= target) break;
    }
    end = cut;
  }

  if (params_.min_p > 0.0f) {
    const float max_logit =
        sorted ? begin->first : std::max_element(begin, end, [](const auto& a, const auto& b) {
                                  return a.first < b.first;
                                })->first;
    // p >= min_p * p_max  <=>  logit >= max_logit + log(min_p); the max itself always passes.
    const float threshold = max_logit + std::log(params_.min_p);
    end = std::remove_if(begin, end, [threshold, max_logit](const auto& c) {
      return c.first < threshold && c.first != max_logit;
    });
  }

  // Temperature, softmax and the draw, without normalizing: draw in [0, total) instead.
  float max_logit = begin->first;
  for (auto it = begin; it != end; ++it) max_logit = std::max(max_logit, it->first);
  const double inv_temperature = 1.0 / params_.temperature;
  double total = 0;
  for (auto it = begin; it != end; ++it) {
    it->first = static_cast<float>(
        std::exp(static_cast<double>(it->first - max_logit) * inv_temperature));
    total += it->first;
  }
  const double r = std::uniform_real_distribution<double>(0.0, total)(rng_);
  double mass = 0;
  auto last_drawable = begin;  // the max has weight 1, so some candidate is drawable
  for (auto it = begin; it != end; ++it) {
    if (it->first <= 0) continue;  // underflowed at a low temperature: never drawn
    mass += it->first;
    last_drawable = it;
    if (r < mass) return it->second;
  }
  // Rounding can leave r at or past the accumulated mass; that edge belongs to the last
  // candidate that has any weight.
  return last_drawable->second;
}

}  // namespace kvllm
