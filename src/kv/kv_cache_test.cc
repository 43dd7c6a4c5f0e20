#include "kv/kv_cache.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/quant.h"

namespace kvllm {
namespace {

KVLayout MakeLayout(int32_t block_size, DType k = DType::kF16, DType v = DType::kF16) {
  auto l = KVLayout::Make(KVShape{.n_layer = 2, .n_kv_head = 3, .head_dim = 32}, block_size, k, v);
  EXPECT_TRUE(l.ok()) << l.status().message();
  return l.value();
}

TEST(KVLayoutTest, BytesPerTokenFollowFormats) {
  // 2 layers × 3 heads × (32 f16 + 32 f32) = 6 × (64 + 128)
  KVLayout l = MakeLayout(16, DType::kF16, DType::kF32);
  EXPECT_EQ(l.bytes_per_token(), 6u * (64 + 128));
  EXPECT_EQ(l.bytes_per_block(), 16u * 6 * (64 + 128));
}

TEST(KVLayoutTest, Llama2_7bF16Is512KiBPerToken) {
  auto l = KVLayout::Make(KVShape{.n_layer = 32, .n_kv_head = 32, .head_dim = 128}, 16,
                          DType::kF16, DType::kF16);
  ASSERT_TRUE(l.ok());
  EXPECT_EQ(l->bytes_per_token(), 524288u);
  EXPECT_EQ(l->bytes_per_token() * 4096, size_t{2} << 30);
}

// The head tiles cover a block record exactly once, for row, dimension-major and KIVI formats.
TEST(KVLayoutTest, HeadTilesCoverTheBlockOnce) {
  struct Case {
    KVFormat k, v;
    int32_t block_size;
  };
  for (const Case& c : {Case{DType::kF32, DType::kF16, 4}, Case{DType::kQ8_0, DType::kQ4_0, 3},
                        Case{DType::kF16, DType::kF16, 16}, Case{KVFormat::Kivi(4),
                        KVFormat::Kivi(4), 5}, Case{KVFormat::Kivi(2), KVFormat::Kivi(2), 5}}) {
    auto l = KVLayout::Make(KVShape{2, 3, 64}, c.block_size, c.k, c.v);
    ASSERT_TRUE(l.ok());
    std::vector<int> owner(l->bytes_per_block(), 0);
    int tiles = 0;
    l->ForEachHeadTile([&](size_t offset, size_t bytes) {
      ++tiles;
      ASSERT_LE(offset + bytes, owner.size());
      for (size_t b = 0; b < bytes; ++b) ++owner[offset + b];
    });
    EXPECT_EQ(tiles, 2 * 2 * 3) << c.k.name();
    for (int n : owner) ASSERT_EQ(n, 1) << c.k.name() << "/" << c.v.name();
    EXPECT_EQ(l->VHeadOffset(1, 2) + l->v_head_bytes(), l->bytes_per_block());
    EXPECT_EQ(l->v_head_bytes(), c.block_size * l->v_row_bytes());
  }
}

TEST(KVLayoutTest, RejectsFormatThatCannotHoldHeadDim) {
  auto l = KVLayout::Make(KVShape{.n_layer = 1, .n_kv_head = 1, .head_dim = 48}, 16,
                          DType::kQ8_0, DType::kF16);
  ASSERT_FALSE(l.ok());
  EXPECT_NE(l.status().message().find("q8_0"), std::string::npos);
}

TEST(KVCacheTest, AppendGrowsBlockTableByBlocks) {
  KVCache kv(MakeLayout(16), 4);
  SeqId s(7);
  EXPECT_EQ(kv.BlocksNeeded(s, 17), 2);
  kv.Append(s, 17);
  EXPECT_EQ(kv.Table(s).blocks.size(), 2u);
  EXPECT_EQ(kv.BlocksNeeded(s, 15), 0);
  kv.Append(s, 15);
  EXPECT_EQ(kv.Table(s).blocks.size(), 2u);
  kv.Append(s, 1);
  EXPECT_EQ(kv.Table(s).blocks.size(), 3u);
  KVStats st = kv.Stats();
  EXPECT_EQ(st.blocks_used, 3);
  EXPECT_EQ(st.tokens_stored, 33);
  EXPECT_DOUBLE_EQ(st.fragmentation, (48.0 - 33.0) / 48.0);
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

TEST(KVCacheTest, FullPoolRefusesWithoutChangingState) {
  KVCache kv(MakeLayout(16), 3);
  SeqId a(1), b(2);
  kv.Append(a, 20);  // 2 of the 3 blocks
  EXPECT_FALSE(kv.CanAppend(b, 17));
  EXPECT_TRUE(kv.CanAppend(b, 16));
  EXPECT_FALSE(kv.Has(b));
  EXPECT_EQ(kv.Stats().blocks_used, 2);
  EXPECT_EQ(kv.CheckIntegrity(), "");
  kv.Free(a);
  EXPECT_EQ(kv.Stats().blocks_used, 0);
  EXPECT_TRUE(kv.CanAppend(b, 48));
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

bool Ascending(const BlockTable& t) {
  for (size_t b = 1; b < t.blocks.size(); ++b) {
    if (t.blocks[b].value != t.blocks[b - 1].value + 1) return false;
  }
  return true;
}

// Attention reads a run of blocks adjacent in the pool as one stream (attention.cc): a
// sequence that follows a freed one must get its blocks ascending again, not backwards.
TEST(KVCacheTest, FreedBlocksComeBackInTheirOrder) {
  KVCache kv(MakeLayout(16), 8);
  kv.Append(SeqId(1), 100);  // 7 blocks
  ASSERT_TRUE(Ascending(kv.Table(SeqId(1))));
  for (int32_t next = 2; next <= 4; ++next) {
    kv.Free(SeqId(next - 1));
    kv.Append(SeqId(next), 100);
    EXPECT_TRUE(Ascending(kv.Table(SeqId(next)))) << "sequence " << next;
  }
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

// An f16 or q8_0 K is stored dimension-major: every (layer, head, slot) must read back exactly
// what a row of that format holds, with no value of another slot, head or layer mixed in.
TEST(KVCacheTest, DimensionMajorKReadsBackEachRowExactly) {
  for (KVFormat k : {KVFormat(DType::kF16), KVFormat(DType::kQ8_0)}) {
    for (int32_t bs : {1, 3, 16}) {
      SCOPED_TRACE(std::string(k.name()) + " block " + std::to_string(bs));
      ASSERT_TRUE(k.dimension_major(KVRole::kK));
      constexpr int32_t kLayers = 2, kHeads = 3, kD = 64, kTokens = 20;
      auto layout = KVLayout::Make(KVShape{kLayers, kHeads, kD}, bs, k, DType::kF16);
      ASSERT_TRUE(layout.ok());
      KVCache kv(layout.value(), kTokens / bs + 1);
      const SeqId seq(1);
      kv.Append(seq, kTokens);
      auto row_of = [](int32_t layer, int32_t pos) {
        std::vector<float> row(kHeads * kD);
        for (size_t i = 0; i < row.size(); ++i) {
          row[i] = std::sin(0.37f * static_cast<float>(i) + 1.3f * pos + 7.1f * layer);
        }
        return row;
      };
      for (int32_t pos = 0; pos < kTokens; ++pos) {
        for (int32_t layer = 0; layer < kLayers; ++layer) {
          kv.WriteK(seq, layer, pos, row_of(layer, pos).data());
        }
      }
      std::vector<uint8_t> q(RowBytes(k.row_type(), kD));
      std::vector<float> want(kD), got(kD);
      for (int32_t pos = 0; pos < kTokens; ++pos) {
        for (int32_t layer = 0; layer < kLayers; ++layer) {
          const std::vector<float> row = row_of(layer, pos);
          for (int32_t h = 0; h < kHeads; ++h) {
            QuantizeRow(k.row_type(), row.data() + h * kD, q.data(), kD);
            DequantizeRow(k.row_type(), q.data(), want.data(), kD);
            kv.ReadK(seq, layer, h, pos, got.data());
            ASSERT_EQ(got, want) << "layer " << layer << " head " << h << " pos " << pos;
          }
        }
      }
    }
  }
}

TEST(KVCacheTest, SequencesGetDisjointRows) {
  for (KVFormat k : {KVFormat(DType::kF16), KVFormat::Kivi(4)}) {
    SCOPED_TRACE(k.name());
    auto layout = KVLayout::Make(KVShape{2, 3, 32}, 2, k, DType::kF16);
    ASSERT_TRUE(layout.ok());
    KVCache kv(layout.value(), 8);
    const SeqId seqs[] = {SeqId(1), SeqId(2)};
    for (SeqId s : seqs) kv.Append(s, 3);
    // Sequence s writes the value s everywhere (exact in every format here: a constant channel).
    for (int i = 0; i < 3; ++i) {
      for (SeqId s : seqs) {
        const std::vector<float> row(3 * 32, static_cast<float>(s.value));
        for (int layer = 0; layer < 2; ++layer) {
          kv.WriteK(s, layer, i, row.data());
          kv.WriteV(s, layer, i, row.data());
          if (i % 2 == 1) kv.SealK(s, layer);
        }
      }
    }
    std::vector<float> out(32);
    for (SeqId s : seqs)
      for (int i = 0; i < 3; ++i) {
        kv.ReadK(s, 1, 2, i, out.data());
        EXPECT_EQ(out[5], static_cast<float>(s.value));
        kv.ReadV(s, 1, 2, i, out.data());
        EXPECT_EQ(out[31], static_cast<float>(s.value));
      }
    EXPECT_EQ(kv.CheckIntegrity(), "");
  }
}

TEST(KVCacheTest, WindowKeepsBlocksBoundedOver5000DecodeSteps) {
  const int32_t bs = 16, window = 64, sinks = 4;
  KVCache kv(MakeLayout(bs), 64, KVWindow{window, sinks});
  SeqId s(1);
  kv.Append(s, 100);  // a prompt longer than the window
  kv.ReleaseOutsideWindow(s, 100);
  const int32_t bound = (sinks + bs - 1) / bs + (window + bs - 1) / bs + 1;
  for (int step = 0; step < 5000; ++step) {
    ASSERT_TRUE(kv.CanAppend(s, 1)) << step;
    kv.Append(s, 1);
    kv.ReleaseOutsideWindow(s, kv.Table(s).num_tokens);
    ASSERT_LE(kv.Stats().blocks_used, bound) << step;
    ASSERT_LE(kv.Stats().blocks_used, (window + sinks + bs - 1) / bs + 1) << step;
  }
  EXPECT_EQ(kv.CheckIntegrity(), "");
  // The sink block and the window's blocks are the ones still held.
  const BlockTable& t = kv.Table(s);
  EXPECT_TRUE(t.blocks.front().valid());
  EXPECT_TRUE(t.blocks.back().valid());
  EXPECT_FALSE(t.blocks[2].valid());
  kv.Free(s);
  EXPECT_EQ(kv.Stats().blocks_used, 0);
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

TEST(KVWindowTest, WindowBeginFollowsTheQuery) {
  KVWindow w{8, 2};
  EXPECT_EQ(w.WindowBegin(5), 0);    // everything is still in reach
  EXPECT_EQ(w.WindowBegin(9), 0);    // sinks [0, 2) + window [2, 9] = all of [0, 9]
  EXPECT_EQ(w.WindowBegin(10), 3);   // sinks [0, 2) and window [3, 10]
  EXPECT_EQ(KVWindow{}.WindowBegin(100000), 0);
}

}  // namespace
}  // namespace kvllm

namespace kvllm {
namespace {

// Writes a recognisable K/V for every position [from, to) of `seq`: value = token id.
void WriteTokens(KVCache& kv, SeqId seq, const std::vector<int32_t>& tokens, int32_t from) {
  const auto& shape = kv.layout().shape();
  std::vector<float> row(static_cast<size_t>(shape.n_kv_head) * shape.head_dim);
  for (int32_t pos = from; pos < static_cast<int32_t>(tokens.size()); ++pos) {
    std::fill(row.begin(), row.end(), static_cast<float>(tokens[pos]));
    for (int32_t l = 0; l < shape.n_layer; ++l) {
      kv.WriteK(seq, l, pos, row.data());
      kv.WriteV(seq, l, pos, row.data());
    }
  }
}

float ReadV0(const KVCache& kv, SeqId seq, int32_t pos) {
  std::vector<float> out(kv.layout().shape().head_dim);
  kv.ReadV(seq, 0, 0, pos, out.data());
  return out[0];
}

// Appends and writes `tokens` to a new sequence and indexes its full blocks.
void Prefill(KVCache& kv, SeqId seq, const std::vector<int32_t>& tokens) {
  const int32_t have = kv.Has(seq) ? kv.Table(seq).num_tokens : 0;
  kv.Append(seq, static_cast<int32_t>(tokens.size()) - have);
  WriteTokens(kv, seq, tokens, have);
  kv.CacheFullBlocks(seq, tokens);
}

std::vector<int32_t> Range(int32_t n, int32_t start = 1) {
  std::vector<int32_t> v(n);
  for (int32_t i = 0; i < n; ++i) v[i] = start + i;
  return v;
}

TEST(KVCacheSharingTest, SecondSequenceReusesTheCachedPrefixInWholeBlocks) {
  KVCache kv(MakeLayout(4, DType::kF32, DType::kF32), 16);
  kv.EnablePrefixCache(1);
  const auto prompt = Range(10);
  Prefill(kv, SeqId(0), prompt);
  EXPECT_EQ(kv.prefix_cache().num_indexed(), 2);  // blocks [0,4) and [4,8); [8,10) is partial

  auto other = prompt;
  other.push_back(77);
  PrefixMatch m = kv.AttachPrefix(SeqId(1), other, static_cast<int32_t>(other.size()) - 1);
  EXPECT_EQ(m.tokens, 8);
  EXPECT_EQ(m.miss, PrefixMiss::kNone);  // block 2 may not be reused: it is partial
  EXPECT_EQ(kv.Table(SeqId(1)).blocks[1], kv.Table(SeqId(0)).blocks[1]);
  EXPECT_EQ(ReadV0(kv, SeqId(1), 7), 8.0f);
  Prefill(kv, SeqId(1), other);
  EXPECT_EQ(ReadV0(kv, SeqId(1), 10), 77.0f);
  EXPECT_EQ(kv.CheckIntegrity(), "");

  // A different first token shares nothing.
  auto changed = prompt;
  changed[0] = 99;
  m = kv.AttachPrefix(SeqId(2), changed, 9);
  EXPECT_EQ(m.tokens, 0);
  EXPECT_EQ(m.miss_block, 0);
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

TEST(KVCacheSharingTest, FreedPrefixStaysCachedUntilMemoryIsNeeded) {
  KVCache kv(MakeLayout(4, DType::kF32, DType::kF32), 4);
  kv.EnablePrefixCache(1);
  const auto a = Range(8);
  Prefill(kv, SeqId(0), a);
  kv.Free(SeqId(0));
  KVStats st = kv.Stats();
  EXPECT_EQ(st.blocks_used, 0);
  EXPECT_EQ(st.blocks_cached_free, 2);
  EXPECT_EQ(kv.available_blocks(), 4);
  EXPECT_EQ(kv.CheckIntegrity(), "");

  // Found again after its user left.
  EXPECT_EQ(kv.AttachPrefix(SeqId(1), a, 7).tokens, 4);  // at most 7 tokens: one block
  kv.Free(SeqId(1));

  // A sequence needing the whole pool evicts both cached blocks.
  ASSERT_TRUE(kv.CanAppend(SeqId(2), 16));
  Prefill(kv, SeqId(2), Range(16, 100));
  EXPECT_EQ(kv.prefix_cache().evictions(), 2);
  kv.Free(SeqId(2));
  const PrefixMatch m = kv.AttachPrefix(SeqId(3), a, 8);
  EXPECT_EQ(m.tokens, 0);
  EXPECT_EQ(m.miss, PrefixMiss::kEvicted);
  kv.Free(SeqId(3));
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

// The same where the freed blocks stay in the prefix cache and are evicted, oldest first, by
// the next sequence: one block short of the whole prefix cached, then the rest from the pool.
TEST(KVCacheSharingTest, EvictedBlocksComeBackInTheirOrder) {
  KVCache kv(MakeLayout(4, DType::kF32, DType::kF32), 6);
  kv.EnablePrefixCache(1);
  Prefill(kv, SeqId(0), Range(18));  // 4 full blocks cached, a partial one
  ASSERT_TRUE(Ascending(kv.Table(SeqId(0))));
  kv.Free(SeqId(0));
  Prefill(kv, SeqId(1), Range(24, 100));  // all 6 blocks: the pool's 2, then 4 evicted
  EXPECT_EQ(kv.prefix_cache().evictions(), 4);
  const BlockTable& t = kv.Table(SeqId(1));
  ASSERT_EQ(t.blocks.size(), 6u);
  // The pool's free blocks first (the partial one and the one never used), then the evicted
  // ones, each group ascending.
  for (size_t b = 3; b < t.blocks.size(); ++b) {
    EXPECT_EQ(t.blocks[b].value, t.blocks[b - 1].value + 1) << "block " << b;
  }
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

TEST(KVCacheSharingTest, ForkSharesBlocksAndCopiesAPartialBlockOnWrite) {
  KVCache kv(MakeLayout(4, DType::kF32, DType::kF32), 8);
  auto prompt = Range(6);
  Prefill(kv, SeqId(0), prompt);
  kv.Fork(SeqId(0), SeqId(1));
  EXPECT_EQ(kv.Stats().blocks_used, 2);
  EXPECT_EQ(kv.CheckIntegrity(), "");

  // The shared partial block [4,8) is copied before either writes position 6.
  EXPECT_EQ(kv.BlocksNeeded(SeqId(1), 1), 1);
  auto one = prompt, two = prompt;
  one.push_back(50);
  two.push_back(60);
  Prefill(kv, SeqId(0), one);
  Prefill(kv, SeqId(1), two);
  EXPECT_EQ(ReadV0(kv, SeqId(0), 6), 50.0f);
  EXPECT_EQ(ReadV0(kv, SeqId(1), 6), 60.0f);
  EXPECT_EQ(ReadV0(kv, SeqId(1), 5), 6.0f);  // copied with the block
  EXPECT_EQ(kv.Table(SeqId(0)).blocks[0], kv.Table(SeqId(1)).blocks[0]);
  EXPECT_NE(kv.Table(SeqId(0)).blocks[1], kv.Table(SeqId(1)).blocks[1]);
  EXPECT_EQ(kv.Stats().blocks_used, 3);
  EXPECT_EQ(kv.CheckIntegrity(), "");
  kv.Free(SeqId(0));
  kv.Free(SeqId(1));
  EXPECT_EQ(kv.Stats().blocks_free, 8);
  EXPECT_EQ(kv.CheckIntegrity(), "");
}

// Every (layer, head, position) of `seq` in [0, n) reads the same from `a` and `b`.
void ExpectSameKV(const KVCache& a, SeqId sa, const KVCache& b, SeqId sb, int32_t n) {
  const auto& shape = a.layout().shape();
  std::vector<float> x(shape.head_dim), y(shape.head_dim);
  for (int32_t l = 0; l < shape.n_layer; ++l)
    for (int32_t h = 0; h < shape.n_kv_head; ++h)
      for (int32_t pos = 0; pos < n; ++pos) {
        a.ReadK(sa, l, h, pos, x.data());
        b.ReadK(sb, l, h, pos, y.data());
        ASSERT_EQ(x, y) << "K layer " << l << " head " << h << " pos " << pos;
        a.ReadV(sa, l, h, pos, x.data());
        b.ReadV(sb, l, h, pos, y.data());
        ASSERT_EQ(x, y) << "V layer " << l << " head " << h << " pos " << pos;
      }
}

// The pool keeps each head's tiles in a region of its own, sized by the pool: a record is
// the block in KVLayout's order whatever the pool, so it moves between pools of other sizes.
TEST(KVCacheSharingTest, BlockRecordsMoveBetweenPoolsOfOtherSizes) {
  auto layout = KVLayout::Make(KVShape{2, 3, 32}, 4, DType::kQ8_0, DType::kF16);
  ASSERT_TRUE(layout.ok());
  KVCache from(*layout, 9), to(*layout, 5);
  from.EnablePrefixCache(1);
  to.EnablePrefixCache(1);
  Prefill(from, SeqId(0), Range(2));  // takes block 0, so that the next one is not block 0
  std::vector<float> row(3 * 32);
  const auto tokens = Range(10, 20);  // two full blocks and a partial one
  from.Append(SeqId(1), 10);
  for (int32_t pos = 0; pos < 10; ++pos) {
    for (int32_t l = 0; l < 2; ++l) {
      for (size_t i = 0; i < row.size(); ++i) row[i] = 0.01f * (i + 97 * pos + 1000 * l);
      from.WriteK(SeqId(1), l, pos, row.data());
      for (float& v : row) v = -v;
      from.WriteV(SeqId(1), l, pos, row.data());
    }
  }
  from.CacheFullBlocks(SeqId(1), tokens);
  const std::vector<BlockRecord> records = from.ExportBlocks(SeqId(1), tokens);
  ASSERT_EQ(records.size(), 2u);
  // Record order: V of layer 1, head 2, slot 3 of the second block is -(95 + 7·97 + 1000)/100.
  const KVLayout& lay = *layout;
  uint16_t v16;
  std::memcpy(&v16, records[1].data.data() + lay.VHeadOffset(1, 2) + 3 * lay.v_row_bytes() +
                        2 * 31, sizeof v16);
  EXPECT_EQ(F16ToF32(v16), F16ToF32(F32ToF16(-0.01f * (95 + 97 * 7 + 1000))));

  ASSERT_EQ(to.ImportBlocks(records), 2);
  EXPECT_EQ(to.AttachPrefix(SeqId(0), tokens, 9).tokens, 8);
  ExpectSameKV(from, SeqId(1), to, SeqId(0), 8);
  EXPECT_EQ(to.CheckIntegrity(), "");

  // Copy on write copies every head of every layer of the partial block (positions 8, 9).
  from.Fork(SeqId(1), SeqId(2));
  const BlockId shared = from.Table(SeqId(2)).blocks[2];
  from.Append(SeqId(2), 1);
  ASSERT_NE(from.Table(SeqId(2)).blocks[2], shared);
  ExpectSameKV(from, SeqId(1), from, SeqId(2), 10);
  EXPECT_EQ(from.CheckIntegrity(), "");
}

TEST(KVCacheSharingTest, KiviStagingStartsAfterTheAttachedPrefix) {
  auto l = KVLayout::Make(KVShape{2, 3, 32}, 4, KVFormat::Kivi(4), KVFormat::Kivi(4));
  ASSERT_TRUE(l.ok());
  KVCache kivi(*l, 8);
  kivi.EnablePrefixCache(1);
  const auto a = Range(8);
  kivi.Append(SeqId(0), 8);
  WriteTokens(kivi, SeqId(0), {a.begin(), a.begin() + 4}, 0);
  for (int32_t layer = 0; layer < 2; ++layer) kivi.SealK(SeqId(0), layer);
  WriteTokens(kivi, SeqId(0), a, 4);
  for (int32_t layer = 0; layer < 2; ++layer) kivi.SealK(SeqId(0), layer);
  kivi.CacheFullBlocks(SeqId(0), a);
  EXPECT_EQ(kivi.AttachPrefix(SeqId(1), a, 7).tokens, 4);
  EXPECT_EQ(kivi.Staged(SeqId(1), 0).block_idx, 1);
  EXPECT_EQ(kivi.CheckIntegrity(), "");
}

}  // namespace
}  // namespace kvllm
