#include "kv/attention_split.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

namespace kvllm {
namespace {

constexpr int32_t kHeads = 2, kHeadDim = 64, kGroup = 4, kBs = 16;

KVLayout Layout(KVFormat kf, KVFormat vf) {
  auto layout = KVLayout::Make(KVShape{1, kHeads, kHeadDim}, kBs, kf, vf);
  KVLLM_CHECK(layout.ok());
  return layout.value();
}

// Sequence i holds lengths[i] random tokens.
void Fill(KVCache& kv, const std::vector<int32_t>& lengths, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> k(kHeads * kHeadDim), v(kHeads * kHeadDim);
  for (size_t s = 0; s < lengths.size(); ++s) {
    const SeqId seq(static_cast<int32_t>(s));
    kv.Append(seq, lengths[s]);
    for (int32_t pos = 0; pos < lengths[s]; ++pos) {
      for (float& x : k) x = nd(rng);
      for (float& x : v) x = nd(rng);
      kv.WriteK(seq, 0, pos, k.data());
      kv.WriteV(seq, 0, pos, v.data());
    }
  }
}

// `slack`: what rounding a q8_0 V's weights to 16 bits per run may add (attention_test.cc).
void ExpectNear(const std::vector<float>& got, const std::vector<float>& want,
                const std::string& what, float slack = 0.0f) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_NEAR(got[i], want[i], 1e-5f * (1.0f + std::abs(want[i])) + slack)
        << what << " i=" << i;
  }
}

float Q8VSlack(const KVCache& kv, int32_t len) {
  if (kv.layout().v_format().row_type() != DType::kQ8_0) return 0.0f;
  std::vector<float> v(kHeadDim);
  float v_max = 0.0f;
  for (int32_t pos = 0; pos < len; ++pos) {
    kv.ReadV(SeqId(0), 0, 1, pos, v.data());
    for (float x : v) v_max = std::max(v_max, std::abs(x));
  }
  return static_cast<float>(len) * v_max / 65534.0f;
}

TEST(SlotClaimTest, ChunksAreTakenInOrderUpToAMovableLimit) {
  SlotClaim c;
  c.Set(0, 1000);
  EXPECT_TRUE(c.TakeChunk(0, 256));
  EXPECT_FALSE(c.TakeChunk(0, 256));  // not the claim's next slot any more
  EXPECT_EQ(c.Next(), 256);
  EXPECT_EQ(c.Unclaimed(), 744);
  // Chunks left: [256, 512), [512, 768), [768, 1000): the front keeps two.
  int32_t begin = 0, end = 0;
  ASSERT_TRUE(c.TakeBackHalf(kBs, &begin, &end));
  EXPECT_EQ(begin, 768);
  EXPECT_EQ(end, 1000);
  EXPECT_TRUE(c.TakeChunk(256, 512));
  ASSERT_FALSE(c.TakeBackHalf(kBs, &begin, &end));  // one chunk left: nothing to take
  EXPECT_TRUE(c.TakeChunk(512, 768));
  EXPECT_FALSE(c.TakeChunk(768, 1000));
  EXPECT_EQ(c.Unclaimed(), 0);
}

TEST(SlotClaimTest, BackHalfIsCutOnTheChunksOfAnUnalignedStart) {
  SlotClaim c;
  // A window from slot 5: its chunks end at 256, 512, 768, 1024, 1100.
  c.Set(5, 1100);
  int32_t begin = 0, end = 0;
  ASSERT_TRUE(c.TakeBackHalf(kBs, &begin, &end));
  EXPECT_EQ(begin, 768);
  EXPECT_EQ(end, 1100);
  EXPECT_EQ(c.Unclaimed(), 763);
  EXPECT_TRUE(c.TakeChunk(5, 256));
}

// A claim cut three ways (the back half taken, then the back half of that) merges to the
// whole attention, in every V path (in place, in integers, through scratch).
TEST(AttentionSplitTest, PiecesTakenFromAClaimMergeToTheWholeAttention) {
  const std::pair<KVFormat, KVFormat> formats[] = {{DType::kF16, DType::kF16},
                                                   {DType::kQ8_0, DType::kQ8_0},
                                                   {DType::kF32, DType::kQ4_0}};
  for (const auto& [kf, vf] : formats) {
    SCOPED_TRACE(std::string(kf.name()) + "/" + vf.name());
    constexpr int32_t kLen = 1500;
    KVCache kv(Layout(kf, vf), kLen / kBs + 2);
    std::mt19937 rng(3);
    Fill(kv, {kLen}, rng);
    std::normal_distribution<float> nd;
    std::vector<float> q(kGroup * kHeadDim);
    for (float& x : q) x = nd(rng);
    const AttentionArgs args{&kv, SeqId(0), 0, 1, kGroup, 0.125f, {{0, kLen, q.data()}}, 1};
    std::vector<float> scratch(AttentionScratchFloats(kv.layout(), kGroup));
    std::vector<float> want(kGroup * kHeadDim), got(kGroup * kHeadDim);
    AttendGroup(args, want.data(), scratch.data());

    SlotClaim claims[3];
    claims[0].Set(0, kLen);
    int32_t begin = 0, end = 0;
    ASSERT_TRUE(claims[0].TakeBackHalf(kBs, &begin, &end));
    claims[1].Set(begin, end);
    ASSERT_TRUE(claims[1].TakeBackHalf(kBs, &begin, &end));
    claims[2].Set(begin, end);
    EXPECT_EQ(end, kLen);
    const int64_t stride = AttentionPartFloats(kGroup, kHeadDim);
    std::vector<float> parts(3 * stride, std::nanf(""));
    const float* part_ptrs[3];
    for (int p = 0; p < 3; ++p) {
      AttendGroupClaimed(args, claims[p], &parts[p * stride], scratch.data());
      EXPECT_EQ(claims[p].Unclaimed(), 0);
      part_ptrs[p] = &parts[p * stride];
    }
    MergeAttentionParts(part_ptrs, 3, kGroup, kHeadDim, got.data());
    ExpectNear(got, want, "merged", Q8VSlack(kv, kLen));
  }
}

// Pairs of very different lengths on more threads than some of them: whatever pieces the
// threads take from each other, every pair's result is its whole attention. One pair reads
// sinks and a window (two spans), which is attended whole.
TEST(AttentionSplitTest, RunMatchesEachPairAttendedAlone) {
  const std::vector<int32_t> lengths = {1, 40, 700, 3000};
  KVCache kv(Layout(DType::kF16, DType::kF16), 3800 / kBs + 8);
  std::mt19937 rng(5);
  Fill(kv, lengths, rng);
  const int32_t n_pairs = static_cast<int32_t>(lengths.size()) * kHeads;
  std::normal_distribution<float> nd;
  std::vector<float> q(n_pairs * kGroup * kHeadDim), q_sinks(kGroup * kHeadDim);
  for (float& x : q) x = nd(rng);
  for (float& x : q_sinks) x = nd(rng);
  auto args_of = [&](int32_t pair) {
    const int32_t s = pair / kHeads, len = lengths[s];
    const float* qp = &q[int64_t{pair} * kGroup * kHeadDim];
    AttentionArgs a{&kv, SeqId(s), 0, pair % kHeads, kGroup, 0.125f, {{0, len, qp}}, 1};
    if (pair == 5) {  // sequence 2, head 1: 4 sinks, then its last 300 slots
      a.spans[0] = {len - 300, len, qp};
      a.spans[1] = {0, 4, q_sinks.data()};
      a.n_spans = 2;
    }
    return a;
  };
  std::vector<float> want(int64_t{n_pairs} * kGroup * kHeadDim);
  const int64_t scratch_floats = AttentionScratchFloats(kv.layout(), kGroup);
  std::vector<float> one(scratch_floats);
  for (int32_t p = 0; p < n_pairs; ++p) {
    AttendGroup(args_of(p), &want[int64_t{p} * kGroup * kHeadDim], one.data());
  }
  for (int threads : {1, 2, 3, 12}) {
    ThreadPool pool(threads);
    std::vector<float> scratch(scratch_floats * threads);
    AttentionSplit split;
    split.Reserve(n_pairs, threads, kGroup, kHeadDim);
    for (int round = 0; round < 4; ++round) {
      std::vector<float> got(want.size(), std::nanf(""));
      split.Run(
          pool, n_pairs, [&](int32_t pair, int) { return args_of(pair); },
          [&](int32_t pair) { return &got[int64_t{pair} * kGroup * kHeadDim]; },
          scratch.data(), scratch_floats);
      ExpectNear(got, want, "threads " + std::to_string(threads));
    }
  }
}

}  // namespace
}  // namespace kvllm
