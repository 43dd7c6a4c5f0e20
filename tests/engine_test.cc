// The engine's generation paths agree with each other: cached decode vs full recompute,
// every block size, one sequence vs several in one batch.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "tensor/thread_pool.h"
#include "test_support.h"

namespace kvllm {
namespace {

using testing::RelativeError;
using testing::TestModel;

std::unique_ptr<Model> LoadTiny() {
  auto m = Model::Load(testing::TinyModel());
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

Request Greedy(std::vector<int32_t> prompt, int32_t n) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.max_tokens = n;
  r.params.sampling.temperature = 0;
  return r;
}

std::vector<int32_t> Generate(Model* model, EngineOptions opts, Request req) {
  auto engine = Engine::Create(model, opts);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  auto id = (*engine)->Add(std::move(req));
  EXPECT_TRUE(id.ok()) << id.status().message();
  std::vector<TokenEvent> events;
  while ((*engine)->HasUnfinished()) (*engine)->Step(&events);
  const Sequence& s = (*engine)->Get(*id);
  return std::vector<int32_t>(s.tokens.begin() + s.n_prompt, s.tokens.end());
}

const std::vector<int32_t> kPrompt = {1, 300, 17, 42, 99, 260, 5, 77, 150, 33, 400, 8, 9, 10};

EngineOptions F32Kv() {
  EngineOptions o;
  o.k_type = o.v_type = DType::kF32;
  o.n_threads = 2;
  o.ctx_size = 256;
  return o;
}

TEST(EngineTest, NoKvCacheBaselineGivesTheSameGreedyTokens) {
  auto model = LoadTiny();
  EngineOptions cached = F32Kv(), baseline = F32Kv();
  baseline.kv_cache = false;
  auto a = Generate(model.get(), cached, Greedy(kPrompt, 32));
  auto b = Generate(model.get(), baseline, Greedy(kPrompt, 32));
  ASSERT_EQ(a.size(), 32u);
  EXPECT_EQ(a, b);
}

// Logits of incremental decode against recomputing the whole sequence, step by step.
TEST(EngineTest, CachedDecodeLogitsEqualFullRecomputeWithinF32Rounding) {
  auto model = LoadTiny();
  const int n_vocab = model->config().n_vocab;
  auto layout = KVLayout::Make(model->kv_shape(), 16, DType::kF32, DType::kF32);
  ASSERT_TRUE(layout.ok());
  KVCache cached(layout.value(), 16), scratch(layout.value(), 16);
  ThreadPool pool(2);
  SeqId seq(0);
  std::vector<int32_t> tokens = kPrompt;
  ForwardBatch batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.Add(tokens[i], i, seq, i + 1 == tokens.size());
  cached.Append(seq, batch.size());
  std::vector<float> inc(n_vocab), full(n_vocab);
  model->Forward(batch, cached, pool, inc.data());
  for (int step = 0; step < 16; ++step) {
    const int next = std::max_element(inc.begin(), inc.end()) - inc.begin();
    tokens.push_back(next);
    batch.Clear();
    batch.Add(next, tokens.size() - 1, seq, true);
    cached.Append(seq, 1);
    model->Forward(batch, cached, pool, inc.data());

    ForwardBatch all;
    for (size_t i = 0; i < tokens.size(); ++i) all.Add(tokens[i], i, seq, i + 1 == tokens.size());
    scratch.Free(seq);
    scratch.Append(seq, all.size());
    model->Forward(all, scratch, pool, full.data());
    EXPECT_LT(RelativeError(inc, full), 1e-5) << "step " << step;
    EXPECT_EQ(std::max_element(inc.begin(), inc.end()) - inc.begin(),
              std::max_element(full.begin(), full.end()) - full.begin());
  }
}

TEST(EngineTest, BlockSizesGiveIdenticalGreedyOutputs) {
  auto model = LoadTiny();
  std::vector<std::vector<int32_t>> outputs;
  for (int32_t bs : {1, 16, 256}) {
    EngineOptions o = F32Kv();
    o.block_size = bs;
    o.ctx_size = 512;
    outputs.push_back(Generate(model.get(), o, Greedy(kPrompt, 40)));
  }
  EXPECT_EQ(outputs[0], outputs[1]);
  EXPECT_EQ(outputs[1], outputs[2]);
}

TEST(EngineTest, F16KvBlockSizesAgreeToo) {
  auto model = LoadTiny();
  EngineOptions a, b;
  a.n_threads = b.n_threads = 2;
  a.block_size = 1;
  b.block_size = 256;
  a.ctx_size = b.ctx_size = 512;
  EXPECT_EQ(Generate(model.get(), a, Greedy(kPrompt, 24)), Generate(model.get(), b, Greedy(kPrompt, 24)));
}

TEST(EngineTest, PromptLongerThanThePoolIsAClearError) {
  auto model = LoadTiny();
  EngineOptions o = F32Kv();
  o.ctx_size = 32;
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  auto id = (*engine)->Add(Greedy(std::vector<int32_t>(40, 5), 4));
  ASSERT_FALSE(id.ok());
  EXPECT_NE(id.status().message().find("40 tokens"), std::string::npos) << id.status().message();
  EXPECT_NE(id.status().message().find("ctx-size"), std::string::npos);
  EXPECT_FALSE((*engine)->HasUnfinished());
}

TEST(EngineTest, OutOfVocabularyTokenIsRejected) {
  auto model = LoadTiny();
  auto engine = Engine::Create(model.get(), F32Kv());
  ASSERT_TRUE(engine.ok());
  EXPECT_FALSE((*engine)->Add(Greedy({1, model->config().n_vocab}, 4)).ok());
  EXPECT_FALSE((*engine)->Add(Greedy({}, 4)).ok());
}

TEST(EngineTest, GenerationStopsWhenTheCacheIsFull) {
  auto model = LoadTiny();
  EngineOptions o = F32Kv();
  o.ctx_size = 20;
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  auto id = (*engine)->Add(Greedy(kPrompt, 100));
  ASSERT_TRUE(id.ok());
  std::vector<TokenEvent> events;
  for (int i = 0; i < 100 && (*engine)->HasUnfinished(); ++i) (*engine)->Step(&events);
  const Sequence& s = (*engine)->Get(*id);
  EXPECT_EQ(s.finish, FinishReason::kContext);
  EXPECT_LE(static_cast<int>(s.tokens.size()), 21);
  EXPECT_EQ((*engine)->kv().CheckIntegrity(), "");
  (*engine)->Release(*id);
  EXPECT_EQ((*engine)->kv().Stats().blocks_used, 0);
}

// Sequences batched together in one forward produce what each produces alone.
TEST(EngineTest, BatchedSequencesMatchSoloRuns) {
  auto model = LoadTiny();
  const std::vector<int32_t> other = {1, 7, 8, 9, 200, 201};
  auto solo_a = Generate(model.get(), F32Kv(), Greedy(kPrompt, 12));
  auto solo_b = Generate(model.get(), F32Kv(), Greedy(other, 12));
  auto engine = Engine::Create(model.get(), F32Kv());
  ASSERT_TRUE(engine.ok());
  SeqId a = (*engine)->Add(Greedy(kPrompt, 12)).value();
  std::vector<TokenEvent> events;
  (*engine)->Step(&events);  // a prefills alone; b joins while a decodes
  SeqId b = (*engine)->Add(Greedy(other, 12)).value();
  while ((*engine)->HasUnfinished()) (*engine)->Step(&events);
  auto gen = [&](SeqId id) {
    const Sequence& s = (*engine)->Get(id);
    return std::vector<int32_t>(s.tokens.begin() + s.n_prompt, s.tokens.end());
  };
  EXPECT_EQ(gen(a), solo_a);
  EXPECT_EQ(gen(b), solo_b);
}

TEST(EngineTest, SeededSamplingIsReproducible) {
  auto model = LoadTiny();
  Request r = Greedy(kPrompt, 20);
  r.params.sampling.temperature = 1.0f;
  r.params.sampling.seed = 1234;
  EXPECT_EQ(Generate(model.get(), F32Kv(), r), Generate(model.get(), F32Kv(), r));
}

}  // namespace
}  // namespace kvllm
