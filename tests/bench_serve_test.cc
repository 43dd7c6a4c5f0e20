// `kvllm bench-serve` as a user runs it: every request completes in every mode, the figures
// are present and within their ranges, and bad flags are refused clearly. No timing checks.
#include <gtest/gtest.h>

#include <string>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace kvllm {
namespace {

using testing::RunCommand;

std::string Kvllm() { return testing::KvllmBinary(); }
std::string Tiny() { return testing::TinyModel(); }

constexpr int kRequests = 10;
constexpr int kSystem = 64;
constexpr int kUser = 8;
constexpr int kMaxTokens = 8;
// A pool of 1024 tokens holds two whole contexts of 512: reserve runs two requests at most.
const std::string kFlags = " --clients 4 --requests 10 --system-tokens 64 --user-tokens 8 "
                           "--max-tokens 8 -r 1 -c 1024 -t 2";

TEST(BenchServeTest, JsonHasEveryModeWithEveryRequestCompleted) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench-serve -m " + Tiny() + kFlags + " --json", &out, &err), 0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_NE(j["command"].get<std::string>().find("kvllm bench-serve"), std::string::npos);
  EXPECT_EQ(j["pool_tokens"].get<int>(), 1024);
  EXPECT_EQ(j["reserve_tokens"].get<int>(), 512);
  ASSERT_EQ(j["modes"].size(), 3u);
  for (const nlohmann::json& m : j["modes"]) {
    const std::string mode = m["mode"];
    SCOPED_TRACE(mode);
    for (const char* key : {"requests_per_s", "requests_per_cpu_s", "tokens_per_s",
                            "ttft_p50_ms", "ttft_p99_ms", "in_flight_mean", "in_flight_max",
                            "prefix_hit_rate", "preemptions", "waste", "pool_use"}) {
      ASSERT_TRUE(m.contains(key)) << key;
      EXPECT_LE(m[key]["min"].get<double>(), m[key]["median"].get<double>()) << key;
      EXPECT_LE(m[key]["median"].get<double>(), m[key]["max"].get<double>()) << key;
    }
    ASSERT_EQ(m["runs"].size(), 1u);
    const nlohmann::json& run = m["runs"][0];
    EXPECT_EQ(run["completed"].get<int>(), kRequests);
    EXPECT_EQ(run["failed"].get<int>(), 0);
    EXPECT_EQ(run["generated_tokens"].get<int>(), kRequests * kMaxTokens);
    EXPECT_GT(m["requests_per_s"]["median"].get<double>(), 0);
    EXPECT_GT(m["tokens_per_s"]["median"].get<double>(), 0);
    EXPECT_GT(m["ttft_p50_ms"]["median"].get<double>(), 0);
    EXPECT_LE(m["ttft_p50_ms"]["median"].get<double>(), m["ttft_p99_ms"]["median"].get<double>());
    EXPECT_GE(m["in_flight_mean"]["median"].get<double>(), 1);
    EXPECT_LE(m["in_flight_max"]["median"].get<double>(), 4);  // --clients
    const double waste = m["waste"]["median"];
    EXPECT_GE(waste, 0);
    EXPECT_LT(waste, 1);
    const double hit = m["prefix_hit_rate"]["median"];
    if (mode == "paged+prefix") {
      // At most the system prompt's full blocks (64 tokens) of each 72-token prompt.
      EXPECT_GT(hit, 0);
      EXPECT_LE(hit, double{kSystem} / (kSystem + kUser));
    } else {
      EXPECT_EQ(hit, 0);
    }
    if (mode == "reserve") {
      EXPECT_LE(m["in_flight_max"]["median"].get<double>(), 2);
      EXPECT_EQ(m["preemptions"]["median"].get<double>(), 0);
      // A request holds at most 79 of its 512 reserved slots.
      EXPECT_GT(waste, 0.8);
    }
  }
  ASSERT_TRUE(j.contains("ratios"));
  EXPECT_GT(j["ratios"]["requests_per_s"].get<double>(), 0);
  EXPECT_GT(j["ratios"]["in_flight_mean"].get<double>(), 1);
}

TEST(BenchServeTest, TablePrintsTheCommandAndTheRatios) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench-serve -m " + Tiny() + kFlags + " --mode all", &out, &err),
            0)
      << err;
  EXPECT_EQ(out.rfind("command: kvllm bench-serve -m ", 0), 0u) << out;
  for (const char* s : {"| paged+prefix |", "| paged        |", "| reserve      |",
                        "paged+prefix / reserve at equal memory"}) {
    EXPECT_NE(out.find(s), std::string::npos) << s << "\n" << out;
  }
}

TEST(BenchServeTest, OneModeRunsAlone) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench-serve -m " + Tiny() + kFlags + " --mode paged --json",
                       &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["modes"].size(), 1u);
  EXPECT_EQ(j["modes"][0]["mode"], "paged");
  EXPECT_FALSE(j.contains("ratios"));
}

TEST(BenchServeTest, AListOfModesRunsInTheUsualOrder) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench-serve -m " + Tiny() + kFlags +
                           " --mode reserve,paged+prefix --json",
                       &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["modes"].size(), 2u);
  EXPECT_EQ(j["modes"][0]["mode"], "paged+prefix");
  EXPECT_EQ(j["modes"][1]["mode"], "reserve");
  EXPECT_TRUE(j.contains("ratios"));
}

// tiny: 256 bytes of f16 K and V per token, so 256 KiB holds a pool of 1024 tokens.
TEST(BenchServeTest, KvMemSetsThePoolOfEveryMode) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench-serve -m " + Tiny() +
                           " --clients 2 --requests 2 --system-tokens 16 --user-tokens 4 "
                           "--max-tokens 2 -r 1 -t 2 --kv-mem 256K --json",
                       &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_EQ(j["pool_tokens"].get<int>(), 1024);
  EXPECT_EQ(j["pool_bytes"].get<int>(), 256 * 1024);
  EXPECT_NE(j["command"].get<std::string>().find(" -c 1024 "), std::string::npos);
}

TEST(BenchServeTest, BadFlagsAreClearErrors) {
  const std::string base = Kvllm() + " bench-serve -m " + Tiny() + " -t 2 ";
  const std::pair<std::string, std::string> cases[] = {
      {"--clients 0", "--clients"},
      {"--requests 0", "--requests"},
      {"--system-tokens 500 --user-tokens 8 --max-tokens 8", "context of 512"},
      {"--max-tokens 0", "--max-tokens"},
      {"--mode fast", "--mode"},
      {"--mode paged,fast", "'fast'"},
      {"-c 256", "cannot reserve one whole context"},
      {"--reserve-tokens 16", "--reserve-tokens"},
      {"--no-prefix-caching", "--mode paged"},
  };
  for (const auto& [flags, message] : cases) {
    SCOPED_TRACE(flags);
    std::string out, err;
    EXPECT_EQ(RunCommand(base + flags, &out, &err), 1);
    EXPECT_NE(err.find(message), std::string::npos) << err;
  }
}

}  // namespace
}  // namespace kvllm
