#include "kv/attention.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kvllm {
namespace {

constexpr int32_t kLayers = 2, kHeads = 2, kHeadDim = 64;

// Random K with a few large channels (the outliers KIVI's per-channel K is made for) and
// plain random V, for every layer and head of one token.
struct TokenKV {
  std::vector<float> k, v;  // [kHeads][kHeadDim]
};

TokenKV RandomToken(std::mt19937& rng) {
  std::normal_distribution<float> nd;
  TokenKV t{std::vector<float>(kHeads * kHeadDim), std::vector<float>(kHeads * kHeadDim)};
  for (int i = 0; i < kHeads * kHeadDim; ++i) {
    t.k[i] = nd(rng) + (i % kHeadDim == 3 ? 8.0f : 0.0f);
    t.v[i] = nd(rng);
  }
  return t;
}

// Writes token `pos` of `seq` in every layer the way the model does: K then, once the token
// completes its block, the block sealed.
void WriteToken(KVCache& kv, SeqId seq, int32_t pos, const TokenKV& t) {
  for (int32_t layer = 0; layer < kLayers; ++layer) {
    kv.WriteK(seq, layer, pos, t.k.data());
    kv.WriteV(seq, layer, pos, t.v.data());
  }
}

void SealIfFull(KVCache& kv, SeqId seq, int32_t pos) {
  if ((pos + 1) % kv.block_size() != 0) return;
  for (int32_t layer = 0; layer < kLayers; ++layer) kv.SealK(seq, layer);
}

// Streaming attention against the oracle: both read the same stored values; only the order
// of f32 arithmetic (and, for q4_0r, the query's rotation) differs.
void ExpectMatchesReference(const KVCache& kv, SeqId seq, int32_t n_ctx, int32_t n_group,
                            int32_t n_spans, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> q(n_group * kHeadDim), q2(n_group * kHeadDim);
  std::vector<float> out(n_group * kHeadDim), want(n_group * kHeadDim);
  for (float& x : q) x = nd(rng);
  for (float& x : q2) x = nd(rng);
  std::vector<float> scratch(AttentionScratchFloats(kv.layout(), n_group));
  AttentionArgs args{&kv, seq, /*layer=*/1, /*kv_head=*/1, n_group,
                     1.0f / std::sqrt(float(kHeadDim)), {{0, n_ctx, q.data()}}, 1};
  if (n_spans == 2) {
    // Sinks [0, 3) read with another query, then the window's last third.
    const int32_t sinks = std::min(3, n_ctx);
    args.spans[0] = {0, sinks, q2.data()};
    args.spans[1] = {sinks + (n_ctx - sinks) * 2 / 3, n_ctx, q.data()};
    args.n_spans = args.spans[1].begin == args.spans[1].end ? 1 : 2;
  }
  AttendGroup(args, out.data(), scratch.data());
  AttendGroup_ref(args, want.data());
  // A q8_0 V is summed with its weights rounded to 16 bits (kernels.h: a term moves by at
  // most |code| * D / 65534 <= max|v| / 65534, the weights being at most 1 and the softmax
  // sum at least 1), which the oracle's f32 sum does not model.
  float v_rounding = 0.0f;
  if (kv.layout().v_format().row_type() == DType::kQ8_0) {
    std::vector<float> v(kHeadDim);
    float v_max = 0.0f;
    for (int32_t pos = 0; pos < n_ctx; ++pos) {
      kv.ReadV(seq, args.layer, args.kv_head, pos, v.data());
      for (float x : v) v_max = std::max(v_max, std::abs(x));
    }
    v_rounding = static_cast<float>(n_ctx) * v_max / 65534.0f;
  }
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(out[i], want[i], 1e-5f * (1.0f + std::abs(want[i])) + v_rounding)
        << "i=" << i << " bs=" << kv.block_size() << " n=" << n_ctx;
  }
  // Flash-decoding: parts cut anywhere (inside a block, before a span, past the end; one part
  // empty) merge to the same result.
  const int32_t cuts[] = {0, n_ctx / 3, n_ctx / 3, std::max(n_ctx / 3, n_ctx / 2 + 1), n_ctx + 5};
  const int64_t stride = AttentionPartFloats(n_group, kHeadDim);
  std::vector<float> parts(4 * stride, std::nanf(""));
  for (int p = 0; p < 4; ++p) {
    AttendGroupPart(args, cuts[p], cuts[p + 1], &parts[p * stride], scratch.data());
  }
  std::vector<float> merged(n_group * kHeadDim);
  const float* part_ptrs[] = {&parts[0], &parts[stride], &parts[2 * stride], &parts[3 * stride]};
  MergeAttentionParts(part_ptrs, 4, n_group, kHeadDim, merged.data());
  for (size_t i = 0; i < out.size(); ++i) {
    ASSERT_NEAR(merged[i], want[i], 1e-5f * (1.0f + std::abs(want[i])) + v_rounding)
        << "split, i=" << i << " bs=" << kv.block_size() << " n=" << n_ctx;
  }
}

// Fills n_ctx tokens (sealing full blocks, so a KIVI K's last partial block stays staged) and
// attends from the end.
void CheckAgainstReference(int32_t block_size, KVFormat kf, KVFormat vf, int32_t n_ctx,
                           int32_t n_group, int32_t n_spans = 1) {
  auto layout = KVLayout::Make(KVShape{kLayers, kHeads, kHeadDim}, block_size, kf, vf);
  ASSERT_TRUE(layout.ok()) << layout.status().message();
  KVCache kv(layout.value(), (n_ctx + block_size - 1) / block_size + 1);
  SeqId seq(0);
  kv.Append(seq, n_ctx);
  std::mt19937 rng(block_size * 131 + n_ctx);
  for (int32_t pos = 0; pos < n_ctx; ++pos) {
    WriteToken(kv, seq, pos, RandomToken(rng));
    SealIfFull(kv, seq, pos);
  }
  ExpectMatchesReference(kv, seq, n_ctx, n_group, n_spans, rng);
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

// A sequence whose blocks lie in the pool in runs of adjacent ids broken by another
// sequence's blocks (as after interleaved requests): K and V read over a run at once, and
// across a break from the next block, match the reference.
TEST(AttentionTest, BlocksScatteredThroughThePoolMatchReference) {
  constexpr int32_t kBs = 16;
  const std::pair<KVFormat, KVFormat> formats[] = {{DType::kF16, DType::kF16},
                                                   {DType::kQ8_0, DType::kQ8_0},
                                                   {DType::kF32, DType::kBF16}};
  for (const auto& [kf, vf] : formats) {
    SCOPED_TRACE(std::string(kf.name()) + "/" + vf.name());
    auto layout = KVLayout::Make(KVShape{kLayers, kHeads, kHeadDim}, kBs, kf, vf);
    ASSERT_TRUE(layout.ok());
    KVCache kv(layout.value(), 64);
    const SeqId seq(0), other(1);
    // Blocks of seq in runs of 1, 3, 2, 5, 1 (the last one partly filled), each run followed
    // by one block of the other sequence.
    int32_t n_ctx = 0;
    for (int32_t run : {1, 3, 2, 5, 1}) {
      const int32_t slots = run == 1 && n_ctx > 0 ? 7 : run * kBs;
      kv.Append(seq, slots);
      n_ctx += slots;
      kv.Append(other, kBs);
    }
    const BlockTable& table = kv.Table(seq);
    ASSERT_NE(table.blocks[1].value, table.blocks[0].value + 1);
    ASSERT_EQ(table.blocks[2].value, table.blocks[1].value + 1);
    std::mt19937 rng(7);
    for (int32_t pos = 0; pos < n_ctx; ++pos) WriteToken(kv, seq, pos, RandomToken(rng));
    for (int32_t g : {1, 8}) ExpectMatchesReference(kv, seq, n_ctx, g, 1, rng);
    ExpectMatchesReference(kv, seq, n_ctx, 2, 2, rng);
  }
}

// Every K format with every V format: the result equals attention over the values the cache
// holds (a partial last block included, which a KIVI K still holds in f16).
TEST(AttentionTest, EveryFormatPairMatchesAttentionOverItsDequantizedValues) {
  for (KVFormat kf : KVFormat::All()) {
    for (KVFormat vf : KVFormat::All()) {
      if (!vf.Validate(KVRole::kV, kHeadDim).ok()) continue;  // q4_0r is K only
      SCOPED_TRACE(std::string(kf.name()) + "/" + vf.name());
      CheckAgainstReference(16, kf, vf, 50, 2);
      CheckAgainstReference(4, kf, vf, 9, 1);
    }
  }
}

TEST(AttentionTest, KiviSinksAndWindowSpansMatchReference) {
  for (KVFormat kf : {KVFormat::Kivi(4), KVFormat::Kivi(2)})
    for (KVFormat vf : {KVFormat::Kivi(4), KVFormat::Kivi(2), KVFormat(DType::kF16)})
      for (int32_t bs : {1, 4, 16})
        for (int32_t n : {4, 20, 100}) {
          SCOPED_TRACE(std::string(kf.name()) + "/" + vf.name());
          CheckAgainstReference(bs, kf, vf, n, 2, 2);
        }
}

// Decoding token by token over a KIVI K: before a block fills, the query reads it from the
// f16 staging (exactly what was written); once full, the block is sealed into the pool and
// later queries read its quantized values. Checked at every step across two transitions.
TEST(AttentionTest, KiviStagingAndTheTransitionAtBlockSize) {
  const int32_t bs = 8;
  for (KVFormat kf : {KVFormat::Kivi(4), KVFormat::Kivi(2)}) {
    SCOPED_TRACE(kf.name());
    auto layout = KVLayout::Make(KVShape{kLayers, kHeads, kHeadDim}, bs, kf, KVFormat::Kivi(2));
    ASSERT_TRUE(layout.ok());
    KVCache kv(layout.value(), 4);
    SeqId seq(5);
    std::mt19937 rng(11);
    std::vector<TokenKV> written;
    std::vector<float> row(kHeadDim);
    for (int32_t pos = 0; pos < 2 * bs + 3; ++pos) {
      kv.Append(seq, 1);
      written.push_back(RandomToken(rng));
      WriteToken(kv, seq, pos, written.back());
      // The block being filled is staged: every K of it reads back as its f16 value.
      EXPECT_EQ(kv.Staged(seq, 1).block_idx, pos / bs);
      for (int32_t i = pos / bs * bs; i <= pos; ++i) {
        kv.ReadK(seq, 1, 1, i, row.data());
        for (int32_t d = 0; d < kHeadDim; ++d) {
          ASSERT_NEAR(row[d], written[i].k[kHeadDim + d],
                      1e-3f * std::abs(written[i].k[kHeadDim + d]));
        }
      }
      ExpectMatchesReference(kv, seq, pos + 1, 2, 1, rng);  // the query inside the block
      SealIfFull(kv, seq, pos);
      ASSERT_EQ(kv.CheckIntegrity(), "");
      if ((pos + 1) % bs == 0) {
        // Sealed: the staging moved on and the block now reads quantized (not the f16 values).
        EXPECT_EQ(kv.Staged(seq, 1).block_idx, pos / bs + 1);
        kv.ReadK(seq, 1, 1, pos, row.data());
        float max_err = 0;
        for (int32_t d = 0; d < kHeadDim; ++d) {
          max_err = std::max(max_err, std::abs(row[d] - written[pos].k[kHeadDim + d]));
        }
        EXPECT_GT(max_err, 1e-3f);
        ExpectMatchesReference(kv, seq, pos + 1, 2, 1, rng);  // the same query after sealing
      }
    }
    EXPECT_EQ(kv.Stats().staging_bytes, layout->staging_bytes_per_sequence());
    kv.Free(seq);
    EXPECT_EQ(kv.Stats().staging_bytes, 0u);
  }
}

TEST(AttentionTest, SingleTokenReturnsItsValue) {
  const int32_t d = 32;
  for (KVFormat f : {KVFormat(DType::kF32), KVFormat::Kivi(4)}) {
    auto layout = KVLayout::Make(KVShape{1, 1, d}, 16, f, DType::kF32);
    ASSERT_TRUE(layout.ok());
    KVCache kv(layout.value(), 1);
    kv.Append(SeqId(0), 1);
    std::vector<float> k(d, 0.5f), v(d);
    for (int i = 0; i < d; ++i) v[i] = float(i);
    kv.WriteK(SeqId(0), 0, 0, k.data());
    kv.WriteV(SeqId(0), 0, 0, v.data());
    std::vector<float> q(d, 1.0f), out(d), scratch(AttentionScratchFloats(kv.layout(), 1));
    AttendGroup({&kv, SeqId(0), 0, 0, 1, 0.1f, {{0, 1, q.data()}}, 1}, out.data(),
                scratch.data());
    for (int i = 0; i < d; ++i) EXPECT_FLOAT_EQ(out[i], float(i));
  }
}

}  // namespace
}  // namespace kvllm
