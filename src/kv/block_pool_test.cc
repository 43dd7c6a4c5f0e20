#include "kv/block_pool.h"

#include <gtest/gtest.h>

namespace kvllm {
namespace {

TEST(BlockPoolTest, AllocateUntilEmptyThenReleaseAll) {
  BlockPool pool(4);
  EXPECT_EQ(pool.num_free(), 4);
  std::vector<BlockId> ids;
  while (pool.CanAllocate(1)) ids.push_back(pool.Allocate());
  EXPECT_EQ(ids.size(), 4u);
  EXPECT_FALSE(pool.CanAllocate(1));
  EXPECT_EQ(pool.num_used(), 4);
  for (BlockId id : ids) pool.Release(id);
  EXPECT_EQ(pool.num_free(), 4);
  EXPECT_EQ(pool.CheckIntegrity(), "");
}

TEST(BlockPoolTest, SharedBlockIsFreedByItsLastReference) {
  BlockPool pool(2);
  BlockId a = pool.Allocate();
  pool.AddRef(a);
  EXPECT_EQ(pool.ref_count(a), 2);
  pool.Release(a);
  EXPECT_EQ(pool.num_free(), 1);
  pool.Release(a);
  EXPECT_EQ(pool.num_free(), 2);
  EXPECT_EQ(pool.CheckIntegrity(), "");
}

TEST(BlockPoolTest, IdsAreDistinct) {
  BlockPool pool(64);
  std::vector<bool> seen(64, false);
  for (int i = 0; i < 64; ++i) {
    BlockId id = pool.Allocate();
    ASSERT_FALSE(seen[id.value]);
    seen[id.value] = true;
  }
}

}  // namespace
}  // namespace kvllm
