#include "kv/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "tensor/quant.h"

namespace kvllm {
namespace {

// Fills `n` tokens of one sequence with random K/V and checks the streaming attention against
// the plain reference for several block sizes, formats and group sizes.
void CheckAgainstReference(int32_t block_size, DType kt, DType vt, int32_t n_ctx,
                           int32_t n_group, int32_t n_spans = 1) {
  const int32_t d = 64, heads = 2, layers = 2;
  auto layout = KVLayout::Make(KVShape{layers, heads, d}, block_size, kt, vt);
  ASSERT_TRUE(layout.ok());
  KVCache kv(layout.value(), (n_ctx + block_size - 1) / block_size + 1);
  SeqId seq(0);
  kv.Append(seq, n_ctx);
  const BlockTable& t = kv.Table(seq);
  std::mt19937 rng(block_size * 131 + n_ctx);
  std::normal_distribution<float> nd;
  std::vector<float> row(d);
  for (int32_t layer = 0; layer < layers; ++layer)
    for (int32_t h = 0; h < heads; ++h)
      for (int32_t i = 0; i < n_ctx; ++i) {
        for (float& x : row) x = nd(rng);
        QuantizeRow(kt, row.data(), kv.KRow(t, layer, h, i), d);
        for (float& x : row) x = nd(rng);
        QuantizeRow(vt, row.data(), kv.VRow(t, layer, h, i), d);
      }
  std::vector<float> q(n_group * d), q2(n_group * d), out(n_group * d), want(n_group * d);
  for (float& x : q) x = nd(rng);
  for (float& x : q2) x = nd(rng);
  std::vector<float> scratch(AttentionScratchFloats(n_group, block_size));
  AttentionArgs args{&kv, &t, /*layer=*/1, /*kv_head=*/1, n_group, 1.0f / std::sqrt(float(d)),
                     {{0, n_ctx, q.data()}}, 1};
  if (n_spans == 2) {
    // Sinks [0, 3) read with another query, then the window's last third.
    args.spans[0] = {0, std::min(3, n_ctx), q2.data()};
    args.spans[1] = {std::min(3, n_ctx) + (n_ctx - std::min(3, n_ctx)) * 2 / 3, n_ctx, q.data()};
    if (args.spans[1].begin == args.spans[1].end) args.n_spans = 1;
    else args.n_spans = 2;
  }
  AttendGroup(args, out.data(), scratch.data());
  AttendGroup_ref(args, want.data());
  for (size_t i = 0; i < out.size(); ++i) {
    // Both read the same stored rows; only the order of f32 arithmetic differs.
    ASSERT_NEAR(out[i], want[i], 1e-5f * (1.0f + std::abs(want[i])))
        << "i=" << i << " bs=" << block_size << " n=" << n_ctx;
  }
}

TEST(AttentionTest, StreamingSoftmaxMatchesReference) {
  for (int32_t bs : {1, 3, 16, 256})
    for (int32_t n : {1, 5, 16, 17, 100})
      for (int32_t g : {1, 4}) CheckAgainstReference(bs, DType::kF32, DType::kF32, n, g);
}

TEST(AttentionTest, SinksAndWindowSpansMatchReference) {
  for (int32_t bs : {1, 4, 16})
    for (int32_t n : {4, 20, 100}) CheckAgainstReference(bs, DType::kF16, DType::kF16, n, 2, 2);
}

TEST(AttentionTest, F16AndMixedFormats) {
  CheckAgainstReference(16, DType::kF16, DType::kF16, 70, 2);
  CheckAgainstReference(16, DType::kF32, DType::kF16, 33, 1);
  CheckAgainstReference(16, DType::kF16, DType::kF32, 33, 3);
}

TEST(AttentionTest, QuantizedFormatsMatchAttentionOverTheirDequantizedValues) {
  for (DType kt : {DType::kBF16, DType::kQ8_0, DType::kQ4_0}) {
    for (DType vt : {DType::kF16, DType::kQ8_0, DType::kQ4_0}) {
      SCOPED_TRACE(std::string(DTypeName(kt)) + "/" + DTypeName(vt));
      CheckAgainstReference(16, kt, vt, 50, 2);
    }
  }
}

TEST(AttentionTest, SingleTokenReturnsItsValue) {
  const int32_t d = 32;
  auto layout = KVLayout::Make(KVShape{1, 1, d}, 16, DType::kF32, DType::kF32);
  ASSERT_TRUE(layout.ok());
  KVCache kv(layout.value(), 1);
  kv.Append(SeqId(0), 1);
  const BlockTable& t = kv.Table(SeqId(0));
  std::vector<float> k(d, 0.5f), v(d);
  for (int i = 0; i < d; ++i) v[i] = float(i);
  QuantizeRow(DType::kF32, k.data(), kv.KRow(t, 0, 0, 0), d);
  QuantizeRow(DType::kF32, v.data(), kv.VRow(t, 0, 0, 0), d);
  std::vector<float> q(d, 1.0f), out(d), scratch(AttentionScratchFloats(1, 16));
  AttendGroup({&kv, &t, 0, 0, 1, 0.1f, {{0, 1, q.data()}}, 1}, out.data(), scratch.data());
  for (int i = 0; i < d; ++i) EXPECT_FLOAT_EQ(out[i], float(i));
}

}  // namespace
}  // namespace kvllm
