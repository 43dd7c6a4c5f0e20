// Continuous batching over the real model: whatever the scheduler does — small token budgets
// (chunked prefill), a pool too small for everyone (preemption), prefix reuse, n > 1 forks —
// every sequence's greedy tokens equal the same request run alone, and the pool ends clean.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>

#include "engine/engine.h"
#include "test_support.h"

namespace kvllm {
namespace {

using testing::TestModel;

std::unique_ptr<Model> LoadTiny() {
  auto m = Model::Load(testing::TinyModel());
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

Request Make(std::vector<int32_t> prompt, int32_t n, float temperature = 0, uint64_t seed = 1) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.max_tokens = n;
  r.params.sampling.temperature = temperature;
  r.params.sampling.seed = seed;
  return r;
}

EngineOptions F32Kv(int32_t ctx = 512) {
  EngineOptions o;
  o.k_type = o.v_type = DType::kF32;
  o.n_threads = 2;
  o.ctx_size = ctx;
  return o;
}

std::vector<int32_t> Generated(const Engine& e, SeqId id) {
  const Sequence& s = e.Get(id);
  return {s.tokens.begin() + s.n_prompt, s.tokens.end()};
}

std::vector<int32_t> Solo(Model* model, Request req, EngineOptions opts = F32Kv()) {
  opts.prefix_caching = false;
  auto engine = Engine::Create(model, opts);
  EXPECT_TRUE(engine.ok());
  SeqId id = (*engine)->Add(std::move(req)).value();
  std::vector<TokenEvent> events;
  while ((*engine)->HasUnfinished()) (*engine)->Step(&events);
  return Generated(**engine, id);
}

// Prompt i: distinct lengths and contents, sharing nothing beyond chance.
std::vector<int32_t> Prompt(int32_t i, int32_t len) {
  std::vector<int32_t> p(len);
  for (int32_t j = 0; j < len; ++j) p[j] = 1 + (i * 131 + j * 17) % 500;
  return p;
}

void RunAll(Engine& e, int max_steps = 5000) {
  std::vector<TokenEvent> events;
  for (int i = 0; i < max_steps && e.HasUnfinished(); ++i) e.Step(&events);
  ASSERT_FALSE(e.HasUnfinished());
}

void ReleaseAllAndCheckClean(Engine& e, const std::vector<SeqId>& ids) {
  for (SeqId id : ids) e.Release(id);
  EXPECT_EQ(e.kv().CheckIntegrity(), "");
  const KVStats st = e.kv().Stats();
  EXPECT_EQ(st.blocks_used, 0);
  EXPECT_EQ(st.blocks_free + st.blocks_cached_free, st.blocks_total);
}

TEST(BatchingTest, ChunkedPrefillWithASmallBudgetMatchesSoloRuns) {
  auto model = LoadTiny();
  EngineOptions o = F32Kv();
  o.scheduler.max_num_batched_tokens = 16;  // prompts of up to 60 tokens take several steps
  o.scheduler.max_num_seqs = 4;             // 8 requests: half wait at first
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  std::vector<SeqId> ids;
  for (int i = 0; i < 8; ++i) ids.push_back((*engine)->Add(Make(Prompt(i, 5 + 7 * i), 10)).value());
  size_t max_batch = 0;
  std::vector<TokenEvent> events;
  while ((*engine)->HasUnfinished()) {
    (*engine)->Step(&events);
    max_batch = std::max<size_t>(max_batch, (*engine)->scheduler().num_running());
    ASSERT_LE((*engine)->scheduler().num_running(), 4);
  }
  EXPECT_EQ(max_batch, 4u);
  for (int i = 0; i < 8; ++i) {
    EXPECT_EQ(Generated(**engine, ids[i]), Solo(model.get(), Make(Prompt(i, 5 + 7 * i), 10)))
        << "request " << i;
  }
  ReleaseAllAndCheckClean(**engine, ids);
}

// Prefill cut into chunks that end mid-block (7 tokens per step) computes what one whole
// prefill does, in every KV format, KIVI's staged K included; and a prefix hit does too.
TEST(BatchingTest, ChunkedPrefillAndPrefixHitsMatchWholePrefillInEveryFormat) {
  // head_dim 32: the quantized formats' block size
  auto loaded = Model::Load(TestModel("tiny-hd32-f32-s3", "--preset tiny --type f32 --seed 3 "
                                      "--dim 128 --n-heads 4 --n-kv-heads 2 --ffn 256"));
  ASSERT_TRUE(loaded.ok()) << loaded.status().message();
  auto model = std::move(loaded).value();
  const auto prompt = Prompt(6, 70);
  for (const char* name : {"f16", "q8_0", "q4_0r", "k4", "k2"}) {
    EngineOptions whole = F32Kv();
    whole.k_type = *KVFormat::FromName(name);
    whole.v_type = *KVFormat::FromName(name == std::string("q4_0r") ? "q4_0" : name);
    EngineOptions chunked = whole;
    chunked.scheduler.max_num_batched_tokens = 7;
    const auto expected = Solo(model.get(), Make(prompt, 8), whole);
    EXPECT_EQ(Solo(model.get(), Make(prompt, 8), chunked), expected) << name;
    // The same prompt twice on one engine: the second run reuses 64 tokens from the cache.
    auto engine = Engine::Create(model.get(), chunked);
    ASSERT_TRUE(engine.ok());
    SeqId a = (*engine)->Add(Make(prompt, 8)).value();
    RunAll(**engine);
    SeqId b = (*engine)->Add(Make(prompt, 8)).value();
    RunAll(**engine);
    EXPECT_EQ((*engine)->Get(b).cached_tokens(), 64) << name;
    EXPECT_EQ(Generated(**engine, a), expected) << name;
    EXPECT_EQ(Generated(**engine, b), expected) << name;
    ReleaseAllAndCheckClean(**engine, {a, b});
  }
}

TEST(BatchingTest, PreemptionWhenThePoolRunsOutLosesNoRequest) {
  auto model = LoadTiny();
  // 6 blocks of 16 tokens; each request grows to 20 + 40 = 60 tokens (4 blocks): at most one
  // fits whole, so the newer ones are preempted and recomputed.
  EngineOptions o = F32Kv(96);
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  std::vector<SeqId> ids;
  for (int i = 0; i < 4; ++i) ids.push_back((*engine)->Add(Make(Prompt(i, 20), 40)).value());
  // As a server does, a finished request is read and released at once.
  std::map<int32_t, std::vector<int32_t>> out;
  std::vector<TokenEvent> events;
  for (int step = 0; step < 5000 && (*engine)->HasUnfinished(); ++step) {
    events.clear();
    (*engine)->Step(&events);
    for (const TokenEvent& ev : events) {
      if (ev.finish == FinishReason::kNone) continue;
      EXPECT_EQ(ev.finish, FinishReason::kLength);
      out[ev.seq.value] = Generated(**engine, ev.seq);
      (*engine)->Release(ev.seq);
    }
  }
  EXPECT_GT((*engine)->scheduler().counters().preemptions, 0);
  for (int i = 0; i < 4; ++i) {
    EXPECT_EQ(out[ids[i].value], Solo(model.get(), Make(Prompt(i, 20), 40), o)) << "request " << i;
  }
  ReleaseAllAndCheckClean(**engine, {});
}

TEST(BatchingTest, SecondRequestReusesTheCachedPrefixAndPrefillsOnlyItsSuffix) {
  auto model = LoadTiny();
  auto engine = Engine::Create(model.get(), F32Kv());
  ASSERT_TRUE(engine.ok());
  const std::vector<int32_t> system = Prompt(1, 100);
  auto first = system, second = system;
  first.insert(first.end(), {7, 8, 9});
  second.insert(second.end(), {10, 11, 12, 13});
  SeqId a = (*engine)->Add(Make(first, 5)).value();
  RunAll(**engine);
  SeqId b = (*engine)->Add(Make(second, 5)).value();
  RunAll(**engine);
  const Sequence& sb = (*engine)->Get(b);
  EXPECT_EQ(sb.cached_tokens(), 96);  // 6 whole blocks of the 100 shared tokens
  EXPECT_EQ(sb.timings.prefill_tokens, 104 - 96);
  EXPECT_EQ(sb.prefix.miss, PrefixMiss::kNone);  // block 6 holds the differing suffix
  EXPECT_EQ(Generated(**engine, b), Solo(model.get(), Make(second, 5)));
  EXPECT_GT((*engine)->scheduler().counters().prefix_hits, 0);
  ReleaseAllAndCheckClean(**engine, {a, b});
}

TEST(BatchingTest, NoPrefixCachingRecomputesEverything) {
  auto model = LoadTiny();
  EngineOptions o = F32Kv();
  o.prefix_caching = false;
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  SeqId a = (*engine)->Add(Make(Prompt(1, 40), 3)).value();
  RunAll(**engine);
  SeqId b = (*engine)->Add(Make(Prompt(1, 40), 3)).value();
  RunAll(**engine);
  EXPECT_EQ((*engine)->Get(b).cached_tokens(), 0);
  EXPECT_EQ((*engine)->Get(b).prefix.miss, PrefixMiss::kDisabled);
  EXPECT_EQ((*engine)->Get(b).timings.prefill_tokens, 40);
  ReleaseAllAndCheckClean(**engine, {a, b});
}

TEST(BatchingTest, NCompletionsShareThePromptBlocksAndMatchSeededSoloRuns) {
  auto model = LoadTiny();
  auto engine = Engine::Create(model.get(), F32Kv());
  ASSERT_TRUE(engine.ok());
  const auto prompt = Prompt(3, 40);  // 2 full blocks and a partial one
  Request r = Make(prompt, 12, 1.0f, 77);
  r.n = 2;
  SeqId first = (*engine)->Add(std::move(r)).value();
  SeqId second(first.value + 1);
  std::vector<TokenEvent> events;
  (*engine)->Step(&events);  // prefill, then the fork
  ASSERT_EQ(events.size(), 2u);
  const auto& ta = (*engine)->kv().Table(first).blocks;
  const auto& tb = (*engine)->kv().Table(second).blocks;
  ASSERT_EQ(ta.size(), 3u);
  EXPECT_EQ(ta, tb);  // shared until one writes the partial block
  (*engine)->Step(&events);
  EXPECT_EQ(ta[1], tb[1]);
  EXPECT_NE(ta[2], tb[2]);  // copied on write
  RunAll(**engine);
  EXPECT_EQ(Generated(**engine, first), Solo(model.get(), Make(prompt, 12, 1.0f, 77)));
  EXPECT_EQ(Generated(**engine, second), Solo(model.get(), Make(prompt, 12, 1.0f, 78)));
  ReleaseAllAndCheckClean(**engine, {first, second});
}

TEST(BatchingTest, RequestWithTwoCompletions) {
  auto model = LoadTiny();
  auto engine = Engine::Create(model.get(), F32Kv());
  ASSERT_TRUE(engine.ok());
  Request r = Make(Prompt(2, 10), 4);
  r.n = 2;
  SeqId first = (*engine)->Add(std::move(r)).value();
  RunAll(**engine);
  // Greedy: both completions are the same.
  EXPECT_EQ(Generated(**engine, first), Generated(**engine, SeqId(first.value + 1)));
  EXPECT_EQ(Generated(**engine, first).size(), 4u);
  ReleaseAllAndCheckClean(**engine, {first, SeqId(first.value + 1)});
}

TEST(BatchingTest, CancellingMidPrefillFreesEverything) {
  auto model = LoadTiny();
  EngineOptions o = F32Kv();
  o.scheduler.max_num_batched_tokens = 8;
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  Request r = Make(Prompt(4, 50), 10);
  r.n = 3;
  SeqId a = (*engine)->Add(std::move(r)).value();
  SeqId b = (*engine)->Add(Make(Prompt(5, 30), 10)).value();
  std::vector<TokenEvent> events;
  (*engine)->Step(&events);
  (*engine)->Step(&events);
  (*engine)->Finish(a, FinishReason::kAbort);  // its two siblings prefill on their own
  RunAll(**engine);
  EXPECT_EQ((*engine)->Get(a).finish, FinishReason::kAbort);
  EXPECT_EQ((*engine)->Get(SeqId(a.value + 1)).finish, FinishReason::kLength);
  EXPECT_EQ((*engine)->Get(SeqId(a.value + 2)).finish, FinishReason::kLength);
  EXPECT_EQ((*engine)->Get(b).finish, FinishReason::kLength);
  ReleaseAllAndCheckClean(**engine, {a, SeqId(a.value + 1), SeqId(a.value + 2), b});
}

}  // namespace
}  // namespace kvllm
