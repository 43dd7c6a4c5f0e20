// The kvllm binary as a user runs it.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace kvllm {
namespace {

using testing::BinaryDir;
using testing::RunCommand;
using testing::TestModel;

std::string Kvllm() { return BinaryDir() + "/kvllm"; }
std::string Tiny() { return TestModel("tiny-f32-s7", "--preset tiny --type f32 --seed 7"); }

nlohmann::json RunJson(const std::string& flags) {
  std::string out, err;
  const int rc = RunCommand(Kvllm() + " run -m " + Tiny() + " " + flags + " --json", &out, &err);
  EXPECT_EQ(rc, 0) << err;
  return nlohmann::json::parse(out);
}

TEST(CliTest, RunJsonReportsTokensTimingsAndKvBytes) {
  auto j = RunJson("-p 'Once upon a time' -n 12 --temp 0 -t 2");
  for (const char* key : {"prompt_tokens", "generated_tokens", "text", "prefill_ms", "decode_ms",
                          "prefill_tokens_per_s", "decode_tokens_per_s", "kv_bytes_per_token",
                          "kv_bytes_used"}) {
    EXPECT_TRUE(j.contains(key)) << key;
  }
  EXPECT_GT(j["prompt_tokens"].get<int>(), 1);
  const auto gen = j["generated_tokens"].get<std::vector<int>>();
  // The tiny model's EOS may come early; otherwise exactly -n tokens.
  EXPECT_LE(gen.size(), 12u);
  EXPECT_GE(gen.size(), 1u);
  // tiny preset: 2 layers x 2 KV heads x head_dim 16, K and V in f16.
  EXPECT_EQ(j["kv_bytes_per_token"].get<int>(), 2 * 2 * (16 * 2 + 16 * 2));
  // The last generated token is sampled, never fed back, so its K/V is not stored.
  const int stored = j["prompt_tokens"].get<int>() + static_cast<int>(gen.size()) - 1;
  EXPECT_EQ(j["kv_tokens_stored"].get<int>(), stored);
  EXPECT_EQ(j["kv_bytes_used"].get<int>(), j["kv_bytes_per_token"].get<int>() * 16 * ((stored + 15) / 16));
}

TEST(CliTest, NoKvCacheGivesTheSameTokens) {
  const std::string flags = "-p 'the cat sat on the mat' -n 16 --temp 0 -ctk f32 -ctv f32 --ignore-eos";
  auto a = RunJson(flags);
  auto b = RunJson(flags + " --no-kv-cache");
  EXPECT_EQ(a["generated_tokens"], b["generated_tokens"]);
  EXPECT_EQ(a["generated_tokens"].size(), 16u);
}

TEST(CliTest, PromptLongerThanTheContextIsAClearError) {
  std::string out, err;
  const int rc = RunCommand(Kvllm() + " run -m " + Tiny() +
                                " -c 8 -p 'a b c d e f g h i j k l m n o p' -n 4",
                            &out, &err);
  EXPECT_EQ(rc, 1);
  EXPECT_NE(err.find("ctx-size"), std::string::npos) << err;
}

TEST(CliTest, StreamsTextAndPrintsSummary) {
  std::string out, err;
  const int rc = RunCommand(Kvllm() + " run -m " + Tiny() + " -p hello -n 8 --seed 3", &out, &err);
  ASSERT_EQ(rc, 0) << err;
  EXPECT_EQ(out.rfind("hello", 0), 0u) << out;
  EXPECT_NE(err.find("prefill"), std::string::npos) << err;
  EXPECT_NE(err.find("tokens/s"), std::string::npos);
  EXPECT_NE(err.find("bytes per token"), std::string::npos);
}

TEST(CliTest, InspectListsMetadataTensorsAndKvCost) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " inspect " + Tiny(), &out, &err), 0) << err;
  EXPECT_NE(out.find("general.architecture"), std::string::npos);
  EXPECT_NE(out.find("blk.1.ffn_down.weight"), std::string::npos);
  EXPECT_NE(out.find("bytes per token"), std::string::npos);
}

TEST(CliTest, TruncatedOrMissingModelIsAnErrorNotACrash) {
  const std::string bad = BinaryDir() + "/test-models/truncated.gguf";
  {
    std::ifstream in(Tiny(), std::ios::binary);
    std::vector<char> data(3000);
    in.read(data.data(), data.size());
    std::ofstream(bad, std::ios::binary).write(data.data(), data.size());
  }
  std::string out, err;
  EXPECT_EQ(RunCommand(Kvllm() + " run -m " + bad + " -p hi -n 2", &out, &err), 1);
  EXPECT_NE(err.find("gguf"), std::string::npos) << err;
  EXPECT_EQ(RunCommand(Kvllm() + " run -m /nonexistent.gguf -p hi", &out, &err), 1);
  EXPECT_NE(err.find("/nonexistent.gguf"), std::string::npos) << err;
  std::filesystem::remove(bad);
}

TEST(CliTest, TokenizePrintsIdsWithBos) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " tokenize -m " + Tiny() + " -p 'the cat' --ids", &out, &err), 0)
      << err;
  auto ids = nlohmann::json::parse(out).get<std::vector<int>>();
  ASSERT_GE(ids.size(), 2u);
  EXPECT_EQ(ids[0], 1);  // BOS
  ASSERT_EQ(RunCommand(Kvllm() + " tokenize -m " + Tiny() + " -p 'the cat' --ids --no-bos", &out,
                       &err),
            0);
  auto no_bos = nlohmann::json::parse(out).get<std::vector<int>>();
  EXPECT_EQ(std::vector<int>(ids.begin() + 1, ids.end()), no_bos);
}

}  // namespace
}  // namespace kvllm
