#include "engine/sampler.h"

#include <cmath>
#include <set>
#include <vector>

#include <gtest/gtest.h>

namespace kvllm {
namespace {

SamplingParams Greedy() {
  SamplingParams params;
  params.temperature = 0.0f;
  return params;
}

// Nothing filtered: every token keeps its softmax probability.
SamplingParams Unfiltered(uint64_t seed) {
  SamplingParams params;
  params.temperature = 1.0f;
  params.top_k = 0;
  params.top_p = 1.0f;
  params.min_p = 0.0f;
  params.seed = seed;
  return params;
}

std::vector<int32_t> Draw(Sampler& sampler, const std::vector<float>& logits, int n) {
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    out.push_back(sampler.Sample(logits.data(), static_cast<int32_t>(logits.size()), {}));
  }
  return out;
}

TEST(SamplerTest, GreedyPicksArgmax) {
  Sampler sampler(Greedy());
  const std::vector<float> logits = {0.1f, -2.0f, 3.5f, 3.4f, -0.5f};
  EXPECT_EQ(sampler.Sample(logits.data(), 5, {}), 2);
}

TEST(SamplerTest, GreedyBreaksTiesByLowestId) {
  Sampler sampler(Greedy());
  const std::vector<float> logits = {1.0f, 7.0f, 2.0f, 7.0f};
  EXPECT_EQ(sampler.Sample(logits.data(), 4, {}), 1);
}

TEST(SamplerTest, SameSeedGivesSameSequence) {
  const std::vector<float> logits(100, 0.0f);
  Sampler a(Unfiltered(42));
  Sampler b(Unfiltered(42));
  EXPECT_EQ(Draw(a, logits, 64), Draw(b, logits, 64));
}

TEST(SamplerTest, DifferentSeedsGiveDifferentSequences) {
  const std::vector<float> logits(100, 0.0f);
  Sampler a(Unfiltered(1));
  Sampler b(Unfiltered(2));
  EXPECT_NE(Draw(a, logits, 64), Draw(b, logits, 64));
}

TEST(SamplerTest, RandomSeedStillSamplesValidTokens) {
  const std::vector<float> logits(10, 0.0f);
  Sampler sampler(Unfiltered(SamplingParams::kRandomSeed));
  for (int32_t id : Draw(sampler, logits, 100)) {
    EXPECT_GE(id, 0);
    EXPECT_LT(id, 10);
  }
}

TEST(SamplerTest, UniformLogitsReachEveryToken) {
  const std::vector<float> logits(8, 0.0f);
  Sampler sampler(Unfiltered(7));
  const std::vector<int32_t> draws = Draw(sampler, logits, 2000);
  EXPECT_EQ(std::set<int32_t>(draws.begin(), draws.end()).size(), 8u);
}

TEST(SamplerTest, TopKOneEqualsGreedy) {
  SamplingParams params = Unfiltered(3);
  params.top_k = 1;
  Sampler sampler(params);
  Sampler greedy(Greedy());
  std::vector<float> logits(1000);
  for (int round = 0; round < 20; ++round) {
    for (size_t i = 0; i < logits.size(); ++i) {
      logits[i] = std::sin(static_cast<float>(i * 7 + round * 13));
    }
    EXPECT_EQ(sampler.Sample(logits.data(), 1000, {}), greedy.Sample(logits.data(), 1000, {}));
  }
}

TEST(SamplerTest, TopKKeepsOnlyTheKBest) {
  SamplingParams params = Unfiltered(4);
  params.top_k = 3;
  Sampler sampler(params);
  // Ids 5, 6, 7 hold the three largest logits; the rest are close enough to be drawn often
  // if top-k failed to remove them.
  std::vector<float> logits = {1.0f, 1.1f, 1.2f, 0.9f, 1.3f, 2.0f, 2.1f, 2.2f};
  std::set<int32_t> seen;
  for (int32_t id : Draw(sampler, logits, 2000)) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int32_t>{5, 6, 7}));
}

TEST(SamplerTest, TopPDropsTheTail) {
  // Probabilities 0.5, 0.3, 0.15, 0.05: the smallest prefix reaching 0.75 is {0, 1}.
  const std::vector<float> logits = {std::log(0.5f), std::log(0.3f), std::log(0.15f),
                                     std::log(0.05f)};
  SamplingParams params = Unfiltered(5);
  params.top_p = 0.75f;
  Sampler sampler(params);
  std::set<int32_t> seen;
  for (int32_t id : Draw(sampler, logits, 2000)) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1}));
}

TEST(SamplerTest, TopPKeepsAtLeastOneToken) {
  const std::vector<float> logits = {0.0f, 0.0f, 5.0f, 0.0f};
  SamplingParams params = Unfiltered(6);
  params.top_p = 0.0f;
  Sampler sampler(params);
  for (int32_t id : Draw(sampler, logits, 100)) EXPECT_EQ(id, 2);
}

TEST(SamplerTest, MinPDropsUnlikelyTokens) {
  // Relative to the top token: 1, 0.5, 0.2, 0.05, 0.01. min_p = 0.1 keeps the first three.
  const std::vector<float> logits = {std::log(1.0f), std::log(0.5f), std::log(0.2f),
                                     std::log(0.05f), std::log(0.01f)};
  SamplingParams params = Unfiltered(8);
  params.min_p = 0.1f;
  Sampler sampler(params);
  std::set<int32_t> seen;
  for (int32_t id : Draw(sampler, logits, 3000)) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int32_t>{0, 1, 2}));
}

TEST(SamplerTest, FiltersCombineOverALargeVocabulary) {
  // A Llama-sized vocabulary with the default chain (top-k 40, top-p 0.95, min-p 0.05).
  std::vector<float> logits(32000, -10.0f);
  logits[123] = 5.0f;
  logits[31999] = 4.5f;
  logits[7] = 4.0f;
  SamplingParams params;
  params.seed = 9;
  Sampler sampler(params);
  std::set<int32_t> seen;
  for (int32_t id : Draw(sampler, logits, 500)) seen.insert(id);
  EXPECT_EQ(seen, (std::set<int32_t>{7, 123, 31999}));
}

TEST(SamplerTest, RepetitionPenaltyChangesArgmax) {
  SamplingParams params = Greedy();
  params.repeat_penalty = 1.5f;
  params.repeat_last_n = 4;
  Sampler sampler(params);
  // Positive logit: 3.0 / 1.5 = 2.0 < 2.5, so token 1 wins over the repeated token 0.
  const std::vector<float> positive = {3.0f, 2.5f, 1.0f};
  EXPECT_EQ(sampler.Sample(positive.data(), 3, {0}), 1);
  // Repeating a token several times still penalizes it once: 3.0 / 1.5 = 2.0 > 1.9.
  const std::vector<float> close = {3.0f, 1.9f};
  EXPECT_EQ(sampler.Sample(close.data(), 2, {0, 0, 0}), 0);
  // Negative logit: -1.0 * 1.5 = -1.5 < -1.2.
  const std::vector<float> negative = {-1.0f, -1.2f};
  EXPECT_EQ(sampler.Sample(negative.data(), 2, {0}), 1);
  EXPECT_EQ(sampler.Sample(negative.data(), 2, {}), 0);
}

TEST(SamplerTest, RepetitionPenaltyOnlyLooksAtTheWindow) {
  SamplingParams params = Greedy();
  params.repeat_penalty = 2.0f;
  params.repeat_last_n = 2;
  Sampler sampler(params);
  const std::vector<float> logits = {3.0f, 2.0f, 0.0f};
  // Token 0 is three steps back, outside the window of 2.
  EXPECT_EQ(sampler.Sample(logits.data(), 3, {0, 2, 2}), 0);
  EXPECT_EQ(sampler.Sample(logits.data(), 3, {2, 0, 2}), 1);
  // Out-of-range ids in the history are ignored.
  EXPECT_EQ(sampler.Sample(logits.data(), 3, {-1, 99}), 0);
}

TEST(SamplerTest, TinyTemperatureIsGreedy) {
  SamplingParams params = Unfiltered(10);
  params.temperature = 1e-6f;
  Sampler sampler(params);
  const std::vector<float> logits = {0.5f, 2.0f, 1.99f, -3.0f};
  for (int32_t id : Draw(sampler, logits, 200)) EXPECT_EQ(id, 1);
}

TEST(SamplerTest, VocabularySizeCanChangeBetweenCalls) {
  Sampler sampler(Unfiltered(11));
  const std::vector<float> big(50, 0.0f);
  const std::vector<float> small = {0.0f, 0.0f};
  EXPECT_LT(sampler.Sample(big.data(), 50, {}), 50);
  EXPECT_LT(sampler.Sample(small.data(), 2, {}), 2);
  EXPECT_LT(sampler.Sample(big.data(), 50, {}), 50);
}

}  // namespace
}  // namespace kvllm
