// `kvllm bench` as a user runs it: the JSON and the table carry every row, the roofline's
// ceilings and each row's fraction of its limit; --no-roofline leaves them out. The ranges
// are loose sanity bounds, not timing checks.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>

#include <nlohmann/json.hpp>

#include "test_support.h"

namespace kvllm {
namespace {

using testing::RunCommand;

std::string Kvllm() { return testing::KvllmBinary(); }
std::string Tiny() { return testing::TinyModel(); }

// Small and quick: a 64 MiB buffer is still past the test machines' L3.
const std::string kFlags = " -t 2 -p 32 -n 8 -r 1 --depths 16,64 --depth-steps 2 --cache-only "
                           "--roofline-buffer-mib 64";

void ExpectFraction(const nlohmann::json& row, const char* key) {
  ASSERT_TRUE(row.contains(key)) << row.dump();
  const double fraction = row[key];
  EXPECT_GT(fraction, 0) << row.dump();
  // The tiny model's weights (0.5 MiB) stay in the caches, so its decode beats the DRAM-bound
  // limit a few times over (3x on the 2-core test machine); a loose bound, not a timing check.
  EXPECT_LT(fraction, 50) << row.dump();
}

TEST(BenchTest, JsonHasTheRooflineAndEachRowsFractionOfItsLimit) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench -m " + Tiny() + kFlags + " --json", &out, &err), 0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_NE(j["command"].get<std::string>().find("kvllm bench"), std::string::npos);
  EXPECT_EQ(j["mmap"], true);
  EXPECT_EQ(j["repack"], true);
  ASSERT_TRUE(j.contains("roofline"));
  const nlohmann::json& roof = j["roofline"];
  const double bw = roof["read_bytes_per_s"];
  EXPECT_GE(bw, 0.5e9);
  EXPECT_LE(bw, 1000e9);
  EXPECT_GT(roof["fma_flops_per_s"].get<double>(), 0);
  EXPECT_GT(roof["int8_ops_per_s"].get<double>(), 0);
  EXPECT_GT(roof["matmul_f32_flops_per_s"].get<double>(), 0);
  EXPECT_EQ(roof["buffer_bytes"].get<int64_t>(), int64_t{64} << 20);
  EXPECT_EQ(roof["threads"].get<int>(), 2);
  EXPECT_GT(j["kv_bytes_per_token"].get<double>(), 0);

  ASSERT_EQ(j["rows"].size(), 2u);
  const nlohmann::json& pp = j["rows"][0];
  const nlohmann::json& tg = j["rows"][1];
  EXPECT_EQ(pp["test"], "pp32");
  EXPECT_EQ(tg["test"], "tg8");
  EXPECT_GT(pp["flops_per_token"].get<double>(), 0);
  // f32 weights: every FLOP at the FMA peak.
  EXPECT_EQ(pp["int8_ops_per_token"].get<double>(), 0);
  EXPECT_NEAR(pp["limit_tokens_per_s"].get<double>(),
              roof["fma_flops_per_s"].get<double>() / pp["flops_per_token"].get<double>(),
              1e-9 * pp["limit_tokens_per_s"].get<double>());
  EXPECT_GT(tg["bytes_per_token"].get<double>(), 0);
  // A decode row's limit (one run, -r 1): the weights at the bandwidth measured just before
  // it, then attention, bound by the larger of reading the cache and its arithmetic (an f16
  // cache: every FLOP at the FMA peak).
  const double weights = j["weight_bytes_per_token"], kv = j["kv_bytes_per_token"];
  const double attention = j["attention_flops_per_token"];
  EXPECT_GT(attention, 0);
  EXPECT_EQ(j["attention_int8_share"].get<double>(), 0);
  EXPECT_EQ(j["attention_int16_share"].get<double>(), 0);
  const double fma = roof["fma_flops_per_s"];
  auto expect_limit = [&](const nlohmann::json& row, const char* key) {
    const double bw = row["read_bytes_per_s"];
    EXPECT_GE(bw, 0.5e9);
    const double context = (row["bytes_per_token"].get<double>() - weights) / kv;
    const double seconds = weights / bw + std::max(kv * context / bw, attention * context / fma);
    EXPECT_NEAR(row[key].get<double>(), 1 / seconds, 1e-6 / seconds) << row.dump();
  };
  expect_limit(tg, "limit_tokens_per_s");
  EXPECT_NEAR(tg["fraction_of_limit"].get<double>(),
              tg["tokens_per_s"].get<double>() / tg["limit_tokens_per_s"].get<double>(), 1e-9);
  for (const nlohmann::json* row : {&pp, &tg}) {
    EXPECT_GT((*row)["limit_tokens_per_s"].get<double>(), 0);
    ExpectFraction(*row, "fraction_of_limit");
  }
  ASSERT_EQ(j["depth"].size(), 2u);
  // Deeper contexts read more KV per token: at the same bandwidth the limit falls.
  EXPECT_GT(j["depth"][1]["bytes_per_token"].get<double>(),
            j["depth"][0]["bytes_per_token"].get<double>());
  for (const nlohmann::json& row : j["depth"]) {
    ExpectFraction(row, "cached_fraction_of_limit");
    expect_limit(row, "cached_limit_tokens_per_s");
  }
}

// Q8_0 matrices multiply 8-bit integers: their share of a prompt token's operations is timed at
// the 8-bit dot peak, the rest (attention) at the FMA peak.
TEST(BenchTest, PrefillLimitTimesQuantizedMatricesAtTheInt8Peak) {
  const std::string model =
      testing::TestModel("tiny-q8_0-s7", "--preset tiny --seed 7 --type q8_0");
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench -m " + model +
                           " -t 2 -p 32 -n 8 -r 1 --no-depths --roofline-buffer-mib 64 --json",
                       &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  const nlohmann::json& pp = j["rows"][0];
  const double all = pp["flops_per_token"], int8 = pp["int8_ops_per_token"];
  EXPECT_GT(int8, 0.5 * all);
  EXPECT_LT(int8, all);
  const double fma = j["roofline"]["fma_flops_per_s"];
  const double int8_peak = j["roofline"]["int8_ops_per_s"];
  const double want = 1 / ((all - int8) / fma + int8 / int8_peak);
  EXPECT_NEAR(pp["limit_tokens_per_s"].get<double>(), want, 1e-9 * want);
}

TEST(BenchTest, NoRooflineLeavesTheLimitsOut) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench -m " + Tiny() + kFlags +
                           " --no-roofline --no-mmap --no-repack --json",
                       &out, &err),
            0)
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  EXPECT_NE(j["command"].get<std::string>().find("--no-roofline"), std::string::npos);
  // The weights' load mode is part of what produced the numbers.
  EXPECT_NE(j["command"].get<std::string>().find("--no-mmap"), std::string::npos);
  EXPECT_EQ(j["mmap"], false);
  EXPECT_NE(j["command"].get<std::string>().find("--no-repack"), std::string::npos);
  EXPECT_EQ(j["repack"], false);
  EXPECT_FALSE(j.contains("roofline"));
  for (const nlohmann::json& row : j["rows"]) {
    EXPECT_GT(row["tokens_per_s"].get<double>(), 0);
    EXPECT_FALSE(row.contains("fraction_of_limit"));
  }
  for (const nlohmann::json& row : j["depth"]) {
    EXPECT_FALSE(row.contains("cached_fraction_of_limit"));
  }
}

// The slowdown at depth is a ratio of runs close in time: each repetition runs every depth,
// the deepest first and the first depth last, and each row carries the median of the
// repetitions' ratios to the first depth.
TEST(BenchTest, DepthRunsArePairedWithTheFirstDepthInEachRepetition) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench -m " + Tiny() +
                           " -t 2 -p 8 -n 2 -r 2 --depths 16,64 --depth-steps 2 --cache-only "
                           "--no-roofline --json",
                       &out, &err),
            0)
      << err;
  std::vector<std::string> runs;
  for (size_t at = 0; (at = err.find("bench: depth ", at)) != std::string::npos; ++at) {
    runs.push_back(err.substr(at + 13, err.find('\n', at) - at - 13));
  }
  EXPECT_EQ(runs, (std::vector<std::string>{"64 run 1/2", "16 run 1/2", "64 run 2/2",
                                            "16 run 2/2"}))
      << err;
  const nlohmann::json j = nlohmann::json::parse(out);
  ASSERT_EQ(j["depth"].size(), 2u);
  EXPECT_EQ(j["depth"][0]["depth"], 16);  // rows keep the order asked for
  EXPECT_EQ(j["depth"][0]["cached_vs_first_depth"].get<double>(), 1.0);
  const double vs = j["depth"][1]["cached_vs_first_depth"];
  EXPECT_GT(vs, 0) << j.dump();
  EXPECT_LT(vs, 10) << j.dump();

  ASSERT_EQ(RunCommand(Kvllm() + " bench -m " + Tiny() +
                           " -t 2 -p 8 -n 2 -r 1 --depths 16,64 --depth-steps 2 --cache-only "
                           "--no-roofline",
                       &out, &err),
            0)
      << err;
  EXPECT_NE(out.find("| vs depth 16 |"), std::string::npos) << out;
  EXPECT_NE(out.find("+0.0%"), std::string::npos) << out;
}

TEST(BenchTest, TablePrintsTheCommandTheCeilingsAndTheLimitColumns) {
  std::string out, err;
  ASSERT_EQ(RunCommand(Kvllm() + " bench -m " + Tiny() + kFlags, &out, &err), 0) << err;
  EXPECT_NE(out.find("command: kvllm bench"), std::string::npos) << out;
  EXPECT_NE(out.find("read bandwidth"), std::string::npos) << out;
  EXPECT_NE(out.find("FMA peak"), std::string::npos) << out;
  EXPECT_NE(out.find("8-bit dot peak"), std::string::npos) << out;
  EXPECT_NE(out.find("| limit tokens/s | % of limit |"), std::string::npos) << out;
  EXPECT_NE(out.find("| pp32 "), std::string::npos) << out;
  EXPECT_NE(out.find("| tg8 "), std::string::npos) << out;
}

}  // namespace
}  // namespace kvllm
