// Persistent KV tiers under the engine: blocks computed by one engine are read back by
// another (a restart: disk; another server: Redis) instead of prefilled, with the same greedy
// tokens; a corrupt, truncated or foreign stored block, and a Redis that is down, cost a
// recomputation, never a failed request or a wrong token.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <random>

#include "engine/engine.h"
#include "kv/block_record.h"
#include "redis_process.h"
#include "test_support.h"

namespace kvllm {
namespace {

namespace fs = std::filesystem;
using testing::TestModel;

std::unique_ptr<Model> Load(const std::string& name, const std::string& args) {
  auto m = Model::Load(TestModel(name, args));
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

std::unique_ptr<Model> Tiny() {
  auto m = Model::Load(testing::TinyModel());
  EXPECT_TRUE(m.ok()) << m.status().message();
  return std::move(m).value();
}

std::vector<int32_t> Prompt(int32_t seed, int32_t n) {
  std::vector<int32_t> p(n);
  for (int32_t i = 0; i < n; ++i) p[i] = 3 + (seed * 131 + i * 17) % 500;
  return p;
}

struct Outcome {
  std::vector<int32_t> tokens;  // generated
  int32_t cached = 0;
  int32_t stored = 0;
};

Outcome Generate(Engine& e, std::vector<int32_t> prompt) {
  Request r;
  r.prompt = std::move(prompt);
  r.params.max_tokens = 8;
  r.params.sampling.temperature = 0;
  SeqId id = e.Add(std::move(r)).value();
  std::vector<TokenEvent> events;
  for (int i = 0; i < 1000 && e.HasUnfinished(); ++i) e.Step(&events);
  const Sequence& s = e.Get(id);
  Outcome out{{s.tokens.begin() + s.n_prompt, s.tokens.end()}, s.prefix.tokens,
          s.prefix.stored_tokens};
  e.Release(id);
  return out;
}

EngineOptions Options(const std::string& dir = "", const std::string& redis = "") {
  EngineOptions o;
  o.k_type = o.v_type = DType::kF32;
  o.n_threads = 2;
  o.ctx_size = 512;
  o.kv_store_dir = dir;
  o.kv_store_redis = redis;
  return o;
}

std::unique_ptr<Engine> MakeEngine(Model* m, const EngineOptions& o) {
  auto e = Engine::Create(m, o);
  EXPECT_TRUE(e.ok()) << e.status().message();
  return std::move(e).value();
}

// A fresh directory under the build folder, removed first.
std::string Dir(const std::string& name) {
  const std::string d = testing::BinaryDir() + "/store-test-" + name;
  fs::remove_all(d);
  return d;
}

std::vector<fs::path> BlockFiles(const std::string& dir) {
  std::vector<fs::path> files;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() == ".kvb") files.push_back(e.path());
  }
  std::sort(files.begin(), files.end());
  return files;
}

std::vector<uint8_t> ReadBytes(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

void WriteBytes(const fs::path& p, const std::vector<uint8_t>& b) {
  std::ofstream out(p, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
}

TEST(StoreTest, DiskBlocksOutliveTheEngineAndGiveTheSameTokens) {
  auto model = Tiny();
  const std::string dir = Dir("restart");
  const auto prompt = Prompt(1, 100);
  const Outcome expected = Generate(*MakeEngine(model.get(), Options()), prompt);
  {
    auto first = MakeEngine(model.get(), Options(dir));
    EXPECT_EQ(Generate(*first, prompt).tokens, expected.tokens);
  }  // the engine's end writes what is queued
  EXPECT_EQ(BlockFiles(dir).size(), 6u);  // 108 tokens: 6 full blocks
  auto second = MakeEngine(model.get(), Options(dir));
  const Outcome again = Generate(*second, prompt);
  EXPECT_EQ(again.cached, 96);  // 99 tokens may be reused: 6 whole blocks
  EXPECT_EQ(again.stored, 96);
  EXPECT_EQ(again.tokens, expected.tokens);
  EXPECT_EQ(second->store()->stats()[0].hits, 6);
  EXPECT_EQ(second->kv().CheckIntegrity(), "");
}

TEST(StoreTest, CorruptTruncatedAndForeignBlocksAreRecomputed) {
  auto model = Tiny();
  auto other = Load("tiny-f32-s8", "--preset tiny --type f32 --seed 8");
  const auto prompt = Prompt(2, 100);
  const Outcome expected = Generate(*MakeEngine(model.get(), Options()), prompt);
  const std::string foreign_dir = Dir("foreign");
  Generate(*MakeEngine(other.get(), Options(foreign_dir)), prompt);
  const std::vector<fs::path> foreign = BlockFiles(foreign_dir);
  ASSERT_FALSE(foreign.empty());

  struct Damage {
    const char* what;
    std::function<void(const fs::path&)> apply;
  } damages[] = {
      {"a flipped byte",
       [](const fs::path& p) {
         auto b = ReadBytes(p);
         b[b.size() / 2] ^= 0x40;
         WriteBytes(p, b);
       }},
      {"a truncated file",
       [](const fs::path& p) {
         auto b = ReadBytes(p);
         b.resize(b.size() / 3);
         WriteBytes(p, b);
       }},
      {"a block of another model",
       [&](const fs::path& p) { WriteBytes(p, ReadBytes(foreign[0])); }},
      {"an empty file", [](const fs::path& p) { WriteBytes(p, {}); }},
  };
  for (const Damage& d : damages) {
    const std::string dir = Dir("damage");
    Generate(*MakeEngine(model.get(), Options(dir)), prompt);
    const auto files = BlockFiles(dir);
    ASSERT_EQ(files.size(), 6u) << d.what;
    for (const fs::path& f : files) d.apply(f);  // every stored block is damaged
    ::testing::internal::CaptureStderr();
    auto engine = MakeEngine(model.get(), Options(dir));
    const Outcome r = Generate(*engine, prompt);
    const std::string warnings = ::testing::internal::GetCapturedStderr();
    EXPECT_EQ(r.tokens, expected.tokens) << d.what;
    EXPECT_EQ(r.stored, 0) << d.what;
    EXPECT_EQ(engine->store()->stats()[0].rejected, 1) << d.what;  // the chain stops there
    EXPECT_NE(warnings.find("unusable"), std::string::npos) << d.what;
  }
}

TEST(StoreTest, RedisSharesBlocksBetweenEnginesAndADownRedisFailsNothing) {
  if (!testing::HaveRedisServer()) GTEST_SKIP() << "redis-server is not installed";
  auto model = Tiny();
  testing::RedisProcess redis(testing::FreePort());
  ASSERT_TRUE(redis.ok());
  const auto prompt = Prompt(3, 100);
  const Outcome expected = Generate(*MakeEngine(model.get(), Options()), prompt);
  auto a = MakeEngine(model.get(), Options("", redis.url()));
  auto b = MakeEngine(model.get(), Options("", redis.url()));
  EXPECT_EQ(Generate(*a, prompt).tokens, expected.tokens);
  a->store()->Flush();
  const Outcome shared = Generate(*b, prompt);
  EXPECT_EQ(shared.stored, 96);
  EXPECT_EQ(shared.tokens, expected.tokens);

  redis.Kill();
  const auto other = Prompt(4, 60);
  const Outcome solo = Generate(*MakeEngine(model.get(), Options()), other);
  const Outcome down = Generate(*a, other);  // lookups and writes fail: a miss, not an error
  EXPECT_EQ(down.tokens, solo.tokens);
  a->store()->Flush();
  EXPECT_GT(a->store()->stats()[0].errors, 0);

  // A server that is down at start is skipped with a warning.
  ::testing::internal::CaptureStderr();
  auto c = Engine::Create(model.get(), Options("", redis.url()));
  const std::string warning = ::testing::internal::GetCapturedStderr();
  ASSERT_TRUE(c.ok());
  EXPECT_EQ((*c)->store(), nullptr);
  EXPECT_NE(warning.find("running without it"), std::string::npos);
  EXPECT_EQ(Generate(**c, other).tokens, solo.tokens);
}

TEST(StoreTest, ABadDirectoryIsAClearError) {
  auto model = Tiny();
  auto e = Engine::Create(model.get(), Options("/proc/kvllm-cannot-be-here"));
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("--kv-store-dir"), std::string::npos);
  EngineOptions o = Options(Dir("nocache"));
  o.prefix_caching = false;
  e = Engine::Create(model.get(), o);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("prefix cache"), std::string::npos);
}

}  // namespace
}  // namespace kvllm
