// The decode limit `kvllm bench` judges each run against (TokenCosts::DecodeSeconds).
#include "cli/bench_roofline.h"

#include <gtest/gtest.h>

namespace kvllm::cli {
namespace {

// 1 GB of weights, 1 MB of KV and 100 MFLOP of attention per cached token.
TokenCosts Costs() {
  TokenCosts t;
  t.weight_bytes = 1e9;
  t.kv_bytes_per_token = 1e6;
  t.attention_flops_per_pair = 100e6;
  return t;
}

TEST(DecodeSecondsTest, WithoutPeaksCountsTheBytesAlone) {
  const TokenCosts t = Costs();
  EXPECT_DOUBLE_EQ(t.DecodeSeconds(1000, 100e9, 0, 0), t.DecodeBytes(1000) / 100e9);
}

// At 100 GB/s the cache reads 10 us a cached token; at 1 TFLOP/s attention computes 100 us.
TEST(DecodeSecondsTest, AttentionCostsTheLongerOfItsBytesAndItsArithmetic) {
  const TokenCosts t = Costs();
  EXPECT_DOUBLE_EQ(t.DecodeSeconds(1000, 100e9, 1e12, 0), 10e-3 + 1000 * 100e-6);
  EXPECT_DOUBLE_EQ(t.DecodeSeconds(1000, 100e9, 100e12, 0), 10e-3 + 1000 * 10e-6);
}

TEST(DecodeSecondsTest, AnInt8ShareRunsAtTheInt8Peak) {
  TokenCosts t = Costs();
  t.attention_int8_share = 0.5;
  EXPECT_DOUBLE_EQ(t.DecodeSeconds(1000, 100e9, 1e12, 4e12),
                   10e-3 + 1000 * (50e6 / 1e12 + 50e6 / 4e12));
}

TEST(DecodeSecondsTest, AnInt16ShareRunsAtHalfTheInt8Peak) {
  TokenCosts t = Costs();
  t.attention_int8_share = 0.5;
  t.attention_int16_share = 0.5;
  EXPECT_DOUBLE_EQ(t.DecodeSeconds(1000, 100e9, 1e12, 4e12),
                   10e-3 + 1000 * (50e6 / 4e12 + 50e6 / 2e12));
}

TEST(DecodeSecondsTest, AWindowCapsTheContext) {
  TokenCosts t = Costs();
  t.max_context = 100;
  EXPECT_DOUBLE_EQ(t.DecodeSeconds(1000, 100e9, 1e12, 0), t.DecodeSeconds(100, 100e9, 1e12, 0));
}

}  // namespace
}  // namespace kvllm::cli
