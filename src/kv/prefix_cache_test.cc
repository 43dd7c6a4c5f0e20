#include "kv/prefix_cache.h"

#include <gtest/gtest.h>

#include <vector>

namespace kvllm {
namespace {

TEST(PrefixCacheTest, HashChainDependsOnParentIdentityAndTokens) {
  const std::vector<int32_t> a = {1, 2, 3, 4}, b = {1, 2, 3, 5};
  const BlockHash h = HashBlock(0, 7, a);
  EXPECT_EQ(h, HashBlock(0, 7, a));
  EXPECT_NE(h, HashBlock(0, 7, b));
  EXPECT_NE(h, HashBlock(1, 7, a));
  EXPECT_NE(h, HashBlock(0, 8, a));
}

TEST(PrefixCacheTest, FindComparesTokensSoACollisionIsAMiss) {
  PrefixCache cache(4);
  const std::vector<int32_t> a = {1, 2}, b = {3, 4};
  ASSERT_TRUE(cache.Insert(42, BlockId(1), a));
  EXPECT_EQ(cache.Find(42, a), BlockId(1));
  EXPECT_FALSE(cache.Find(42, b).valid());  // same hash, other tokens
  EXPECT_FALSE(cache.Find(43, a).valid());
  EXPECT_FALSE(cache.Insert(42, BlockId(2), a));  // first one wins
  EXPECT_FALSE(cache.Contains(BlockId(2)));
  EXPECT_EQ(cache.CheckIntegrity(), "");
}

TEST(PrefixCacheTest, EvictsLeastRecentlyReleasedFirstAndRemembersIt) {
  PrefixCache cache(4);
  const std::vector<int32_t> t = {9};
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(cache.Insert(100 + i, BlockId(i), t));
  cache.MakeEvictable(BlockId(2));
  cache.MakeEvictable(BlockId(0));
  cache.MakeEvictable(BlockId(1));
  cache.Pin(BlockId(0));  // taken again by a sequence
  EXPECT_EQ(cache.num_evictable(), 2);
  EXPECT_EQ(cache.EvictOldest(), BlockId(2));
  EXPECT_EQ(cache.EvictOldest(), BlockId(1));
  EXPECT_EQ(cache.num_evictable(), 0);
  EXPECT_TRUE(cache.WasEvicted(102));
  EXPECT_FALSE(cache.WasEvicted(100));
  EXPECT_FALSE(cache.Contains(BlockId(2)));
  EXPECT_TRUE(cache.Contains(BlockId(0)));
  EXPECT_EQ(cache.evictions(), 2);
  EXPECT_EQ(cache.CheckIntegrity(), "");
}

}  // namespace
}  // namespace kvllm
