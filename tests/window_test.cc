// Sliding window with attention sinks, end to end.
#include <gtest/gtest.h>

#include <algorithm>

#include "engine/engine.h"
#include "tensor/thread_pool.h"
#include "test_support.h"

namespace kvllm {
namespace {

using testing::ReferenceLogits;
using testing::RelativeError;
using testing::TestModel;

std::unique_ptr<Model> Load(const std::string& name, const std::string& args) {
  auto m = Model::Load(TestModel(name, args));
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

std::vector<int32_t> Generate(Model* model, EngineOptions opts, std::vector<int32_t> prompt,
                              int32_t n) {
  auto engine = Engine::Create(model, opts);
  EXPECT_TRUE(engine.ok()) << engine.status().message();
  Request r;
  r.prompt = std::move(prompt);
  r.params.max_tokens = n;
  r.params.sampling.temperature = 0;
  SeqId id = (*engine)->Add(std::move(r)).value();
  std::vector<TokenEvent> events;
  while ((*engine)->HasUnfinished()) (*engine)->Step(&events);
  const Sequence& s = (*engine)->Get(id);
  return std::vector<int32_t>(s.tokens.begin() + s.n_prompt, s.tokens.end());
}

const std::vector<int32_t> kPrompt = {1, 300, 17, 42, 99, 260, 5, 77, 150, 33, 400, 8, 9, 10};

TEST(WindowTest, WindowCoveringTheSequenceGivesExactlyTheFullCacheResult) {
  auto model = Load("tiny-f32-s7", "--preset tiny --type f32 --seed 7");
  EngineOptions full;
  full.k_type = full.v_type = DType::kF32;
  full.ctx_size = 256;
  full.n_threads = 2;
  EngineOptions windowed = full;
  windowed.kv_window = 64;  // prompt + 40 generated < 64
  windowed.kv_sinks = 4;
  EXPECT_EQ(Generate(model.get(), full, kPrompt, 40), Generate(model.get(), windowed, kPrompt, 40));
}

// In a one-layer model a token's K and V depend only on the token and, through RoPE, on its
// position, so a windowed query must see exactly what a full forward over the sinks followed
// by the window sees (StreamingLLM positions). The numpy reference checks that.
TEST(WindowTest, OneLayerModelMatchesReferenceOverSinksPlusWindow) {
  const std::string path = TestModel("tiny-1layer-f32-s3", "--preset tiny --n-layers 1 --seed 3");
  auto model = Load("tiny-1layer-f32-s3", "--preset tiny --n-layers 1 --seed 3");
  const int32_t window = 8, sinks = 2, n_vocab = model->config().n_vocab;
  auto layout = KVLayout::Make(model->kv_shape(), 4, DType::kF32, DType::kF32);
  ASSERT_TRUE(layout.ok());
  KVCache kv(layout.value(), 32, KVWindow{window, sinks});
  ThreadPool pool(2);
  SeqId seq(0);
  std::vector<int32_t> tokens = {1, 3, 7, 300, 17, 42, 99, 260, 5, 77, 150, 33, 400, 8, 9, 10, 20, 30};
  ForwardBatch batch;
  for (size_t i = 0; i < tokens.size(); ++i) batch.Add(tokens[i], i, seq, i + 1 == tokens.size());
  kv.Append(seq, batch.size());
  std::vector<float> logits(n_vocab);
  for (int step = 0; step < 6; ++step) {
    model->Forward(batch, kv, pool, logits.data());
    const int32_t pos = static_cast<int32_t>(tokens.size()) - 1;
    std::vector<int> compressed(tokens.begin(), tokens.begin() + sinks);
    compressed.insert(compressed.end(), tokens.begin() + (pos + 1 - window), tokens.end());
    const auto ref = ReferenceLogits(path, compressed);
    EXPECT_LT(RelativeError(logits.data(), ref.back()), 1e-4) << "step " << step;
    kv.ReleaseOutsideWindow(seq, pos + 1);
    const int32_t next = std::max_element(logits.begin(), logits.end()) - logits.begin();
    tokens.push_back(next);
    batch.Clear();
    batch.Add(next, pos + 1, seq, true);
    kv.Append(seq, 1);
  }
  EXPECT_LT(kv.Stats().blocks_used, static_cast<int32_t>(tokens.size() + 3) / 4);
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

// A GGUF that declares llama.attention.sliding_window gets that window (without sinks) with
// no flag: the same tokens as asking for it explicitly on the same weights.
TEST(WindowTest, ModelDeclaredSlidingWindowIsUsedAutomatically) {
  auto declared = Load("tiny-f32-s7-swa12", "--preset tiny --type f32 --seed 7 --sliding-window 12");
  auto plain = Load("tiny-f32-s7", "--preset tiny --type f32 --seed 7");
  EXPECT_EQ(declared->config().sliding_window, 12);
  EngineOptions o;
  o.k_type = o.v_type = DType::kF32;
  o.ctx_size = 256;
  o.n_threads = 2;
  const auto automatic = Generate(declared.get(), o, kPrompt, 30);
  EngineOptions explicit_window = o;
  explicit_window.kv_window = 12;
  explicit_window.kv_sinks = 0;
  EXPECT_EQ(automatic, Generate(plain.get(), explicit_window, kPrompt, 30));
  EXPECT_NE(automatic, Generate(plain.get(), o, kPrompt, 30));  // the window does change them
}

TEST(WindowTest, GenerationRunsFarPastTheContextWithFlatMemory) {
  auto model = Load("tiny-f32-s7", "--preset tiny --type f32 --seed 7");
  EngineOptions o;
  o.ctx_size = 64;  // the pool: 4 blocks of 16
  o.block_size = 16;
  o.kv_window = 32;
  o.kv_sinks = 4;
  o.n_threads = 2;
  auto engine = Engine::Create(model.get(), o);
  ASSERT_TRUE(engine.ok());
  Request r;
  r.prompt = kPrompt;
  r.params.max_tokens = 600;
  r.params.sampling.temperature = 0;
  SeqId id = (*engine)->Add(std::move(r)).value();
  std::vector<TokenEvent> events;
  int32_t peak = 0;
  while ((*engine)->HasUnfinished()) {
    (*engine)->Step(&events);
    peak = std::max(peak, (*engine)->kv().Stats().blocks_used);
  }
  const Sequence& s = (*engine)->Get(id);
  EXPECT_EQ(s.finish, FinishReason::kLength);
  EXPECT_EQ(s.n_generated(), 600);
  EXPECT_LE(peak, 1 + 2 + 1);  // ceil(4/16) + ceil(32/16) + 1
  EXPECT_EQ((*engine)->kv().CheckIntegrity(), "");
}

}  // namespace
}  // namespace kvllm
