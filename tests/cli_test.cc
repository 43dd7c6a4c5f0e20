// The kvllm binary as a user runs it.
#include <gtest/gtest.h>

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace kvllm {
namespace {

using testing::BinaryDir;
using testing::RunCommand;

std::string Kvllm() { return testing::KvllmBinary(); }
std::string Tiny() { return testing::TinyModel(); }

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

// --no-mmap reads the same weights into memory instead of mapping them: same tokens.
TEST(CliTest, NoMmapGivesTheSameTokens) {
  const std::string flags = "-p 'the cat sat on the mat' -n 16 --temp 0 --ignore-eos";
  auto a = RunJson(flags);
  auto b = RunJson(flags + " --no-mmap");
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

TEST(CliTest, KvSizeReproducesTheLlama2_7bFigures) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " kv-size --preset llama-2-7b --json", &out, &err), 0) << err;
  auto j = nlohmann::json::parse(out);
  bool found = false;
  for (const auto& f : j["formats"]) {
    if (f["k_type"] != "f16") continue;
    found = true;
    EXPECT_EQ(f["bytes_per_token"].get<uint64_t>(), 524288u);
    EXPECT_EQ(f["contexts"][0]["tokens"].get<int>(), 4096);
    EXPECT_EQ(f["contexts"][0]["bytes"].get<uint64_t>(), uint64_t{2} << 30);
    EXPECT_EQ(f["contexts"][1]["tokens"].get<int>(), 8192);
    EXPECT_EQ(f["contexts"][1]["bytes"].get<uint64_t>(), uint64_t{4} << 30);
  }
  EXPECT_TRUE(found);
}

TEST(CliTest, KvSizeAgreesWithWhatTheEngineAllocates) {
  for (const char* type : {"f32", "f16", "bf16"}) {
    SCOPED_TRACE(type);
    std::string out, err;
    ASSERT_EQ(RunCommand(Kvllm() + " kv-size -m " + Tiny() + " -c 100 --block-size 8 --json",
                         &out, &err),
              0)
        << err;
    uint64_t predicted = 0;
    const auto sizes = nlohmann::json::parse(out);
    for (const auto& f : sizes["formats"]) {
      if (f["k_type"].get<std::string>() == type) predicted = f["contexts"][0]["bytes"].get<uint64_t>();
    }
    auto run = RunJson(std::string("-p hi -n 2 -c 100 --block-size 8 -ctk ") + type + " -ctv " + type);
    EXPECT_EQ(run["kv_bytes_allocated"].get<uint64_t>(), predicted);
    EXPECT_GT(predicted, 0u);
  }
}

TEST(CliTest, KvCacheThatCannotFitIsRefusedWithWhatWouldFit) {
  std::string out, err;
  EXPECT_EQ(RunCommand(Kvllm() + " run -m " + Tiny() + " -p hi -n 2 -c 4096 --kv-mem 100K", &out,
                       &err),
            1);
  // tiny: 256 bytes per token in f16, so 100 KiB holds 400 tokens.
  EXPECT_NE(err.find("at most 400 tokens fit"), std::string::npos) << err;
  EXPECT_EQ(RunCommand(Kvllm() + " run -m " + Tiny() + " -p hi -n 2 --kv-mem lots", &out, &err), 1);
  EXPECT_NE(err.find("lots"), std::string::npos) << err;
}

// Lines of `text` that start with `prefix`.
std::vector<std::string> LinesStartingWith(const std::string& text, const std::string& prefix) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind(prefix, 0) == 0) lines.push_back(line);
  }
  return lines;
}

int ReusedTokens(const std::string& stats_line) {
  return std::stoi(stats_line.substr(std::string("[reused ").size()));
}

// Greedy with f32 KV: reusing the cache and re-prefilling the history give the same replies.
TEST(CliTest, ChatReusesTheKvOfEarlierTurnsAndMatchesFullReprefill) {
  for (const std::string& model : {Tiny(), testing::SourceDir() + "/models/kvllm-prose.gguf"}) {
    SCOPED_TRACE(model);
    const std::string cmd = "printf 'Hello\\nWho are you?\\n' | " + Kvllm() + " chat -m " + model +
                            " --temp 0 -n 24 -ctk f32 -ctv f32";
    std::string reuse_out, reuse_err, full_out, full_err;
    ASSERT_EQ(RunCommand(cmd, &reuse_out, &reuse_err), 0) << reuse_err;
    ASSERT_EQ(RunCommand(cmd + " --no-kv-reuse", &full_out, &full_err), 0) << full_err;
    const auto reuse_stats = LinesStartingWith(reuse_err, "[reused ");
    const auto full_stats = LinesStartingWith(full_err, "[reused ");
    ASSERT_EQ(reuse_stats.size(), 2u) << reuse_err;
    ASSERT_EQ(full_stats.size(), 2u) << full_err;
    EXPECT_EQ(ReusedTokens(reuse_stats[0]), 0);
    EXPECT_GT(ReusedTokens(reuse_stats[1]), 10) << reuse_stats[1];
    EXPECT_EQ(ReusedTokens(full_stats[1]), 0) << full_stats[1];
    EXPECT_EQ(reuse_out, full_out);  // the same replies, turn by turn
    EXPECT_GT(reuse_out.size(), 20u);
  }
}

TEST(CliTest, ChatResetStartsOver) {
  std::string out, err;
  ASSERT_EQ(RunCommand("printf 'Hello\\n/reset\\nHello\\n/quit\\nignored\\n' | " + Kvllm() +
                           " chat -m " + Tiny() + " --temp 0 -n 4",
                       &out, &err),
            0)
      << err;
  const auto stats = LinesStartingWith(err, "[reused ");
  ASSERT_EQ(stats.size(), 2u) << err;
  // The history is gone: the second "Hello" is a one-turn conversation again, with the same
  // length and reply (its prompt may come from the prefix cache, which /reset leaves alone).
  auto conversation = [](const std::string& line) {
    const size_t at = line.rfind(", ") + 2;
    return std::stoi(line.substr(at));
  };
  EXPECT_EQ(conversation(stats[1]), conversation(stats[0])) << stats[0] << "\n" << stats[1];
  EXPECT_EQ(out.substr(0, out.size() / 2), out.substr(out.size() / 2));
}

// A conversation saved with --session and continued by another process replies as the same
// conversation held in one process does, prefilling only the new turn and a partial block.
TEST(CliTest, ChatSessionContinuesAcrossProcesses) {
  const std::string model = testing::SourceDir() + "/models/kvllm-prose.gguf";
  const std::string session = BinaryDir() + "/cli-test-chat.session";
  std::filesystem::remove(session);
  const std::string chat = Kvllm() + " chat -m " + model + " --temp 0 -n 24 -ctk f32 -ctv f32";
  std::string whole_out, whole_err, out1, err1, out2, err2;
  ASSERT_EQ(RunCommand("printf 'Hello\\nWho are you?\\nAnd then?\\n' | " + chat, &whole_out,
                       &whole_err), 0) << whole_err;
  ASSERT_EQ(RunCommand("printf 'Hello\\nWho are you?\\n' | " + chat + " --session " + session,
                       &out1, &err1), 0) << err1;
  EXPECT_NE(err1.find("[new session"), std::string::npos) << err1;
  ASSERT_EQ(RunCommand("printf 'And then?\\n' | " + chat + " --session " + session, &out2, &err2),
            0) << err2;
  EXPECT_NE(err2.find("[restored session"), std::string::npos) << err2;
  const auto stats = LinesStartingWith(err2, "[reused ");
  ASSERT_EQ(stats.size(), 1u) << err2;
  EXPECT_GT(ReusedTokens(stats[0]), 48) << stats[0];
  EXPECT_EQ(out1 + out2, whole_out);

  // Another KV format cannot use it: a clear refusal, and the file is kept.
  ASSERT_EQ(RunCommand("printf 'x\\n' | " + Kvllm() + " chat -m " + model +
                           " -ctk q8_0 -ctv f32 --session " + session, &out2, &err2), 1);
  EXPECT_NE(err2.find("was saved by"), std::string::npos) << err2;
  EXPECT_TRUE(std::filesystem::exists(session));

  // A damaged file is refused too, never half-used.
  std::filesystem::resize_file(session, std::filesystem::file_size(session) / 2);
  ASSERT_EQ(RunCommand("printf 'x\\n' | " + chat + " --session " + session, &out2, &err2), 1);
  EXPECT_NE(err2.find("not a usable kvllm session"), std::string::npos) << err2;
}

TEST(CliTest, RunPromptCacheReusesThePromptsKv) {
  const std::string cache = BinaryDir() + "/cli-test-run.prompt-cache";
  std::filesystem::remove(cache);
  const std::string flags = "-p 'one two three four five six seven eight nine ten eleven twelve "
                            "thirteen fourteen fifteen sixteen seventeen eighteen' -n 6 --temp 0 "
                            "-ctk f32 -ctv f32 --prompt-cache " + cache;
  const nlohmann::json first = RunJson(flags);
  const nlohmann::json second = RunJson(flags);
  EXPECT_EQ(first["cached_tokens"], 0);
  EXPECT_GE(second["cached_tokens"].get<int>(), 16);
  EXPECT_EQ(first["generated_tokens"], second["generated_tokens"]);
}

// Perplexity of one chunk against the numpy reference's logits for the same tokens.
TEST(CliTest, PerplexityMatchesTheReference) {
  const std::string text = testing::SourceDir() + "/README.md";
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " tokenize -m " + Tiny() + " -f " + text + " --ids", &out, &err), 0);
  std::vector<int> tokens = nlohmann::json::parse(out).get<std::vector<int>>();
  constexpr int kCtx = 64;
  ASSERT_GE(tokens.size(), size_t{kCtx});
  tokens.resize(kCtx);
  tokens[0] = 1;  // each chunk starts with BOS
  const auto ref = testing::ReferenceLogits(Tiny(), tokens);
  double nll = 0;
  int n = 0;
  for (int j = kCtx / 2; j < kCtx - 1; ++j, ++n) {
    double m = *std::max_element(ref[j].begin(), ref[j].end()), sum = 0;
    for (double l : ref[j]) sum += std::exp(l - m);
    nll -= ref[j][tokens[j + 1]] - m - std::log(sum);
  }
  const double want = std::exp(nll / n);
  ASSERT_EQ(RunCommand(Kvllm() + " perplexity -m " + Tiny() + " -f " + text +
                           " -c 64 --chunks 1 -ctk f32 -ctv f32",
                       &out, &err),
            0)
      << err;
  const auto final_line = LinesStartingWith(out, "Final estimate: PPL = ");
  ASSERT_EQ(final_line.size(), 1u) << out;
  const double got = std::stod(final_line[0].substr(std::string("Final estimate: PPL = ").size()));
  EXPECT_NEAR(got / want, 1.0, 1e-4) << "kvllm " << got << " reference " << want;
}

TEST(CliTest, KlDivergenceOfARunAgainstItselfIsZero) {
  const std::string text = testing::SourceDir() + "/README.md";
  const std::string base = BinaryDir() + "/test-models/kld-" + std::to_string(getpid()) + ".bin";
  const std::string cmd = Kvllm() + " perplexity -m " + Tiny() + " -f " + text + " -c 64 --chunks 3";
  std::string out, err;
  ASSERT_EQ(RunCommand(cmd + " --kl-divergence-base " + base, &out, &err), 0) << err;
  ASSERT_EQ(RunCommand(cmd + " --kl-divergence " + base, &out, &err), 0) << err;
  EXPECT_NE(out.find("Mean KLD: 0.000000 +/- 0.000000; same top-1 token: 100.000%"),
            std::string::npos)
      << out;
  // A base made with another context size is refused.
  EXPECT_EQ(RunCommand(Kvllm() + " perplexity -m " + Tiny() + " -f " + text +
                           " -c 32 --chunks 3 --kl-divergence " + base,
                       &out, &err),
            1);
  EXPECT_NE(err.find("-c 64"), std::string::npos) << err;
  std::filesystem::remove(base);
}

}  // namespace
}  // namespace kvllm
