#include "base/huge_pages.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <utility>

namespace kvllm {
namespace {

TEST(HugePageBufferTest, StartsOnA2MiBBoundaryZeroFilledAndWritable) {
  for (size_t bytes : {size_t{1}, size_t{4096}, (size_t{2} << 20) + 1, size_t{5} << 20}) {
    HugePageBuffer b = HugePageBuffer::Allocate(bytes);
    ASSERT_NE(b.data(), nullptr) << bytes;
    EXPECT_EQ(b.size(), bytes);
    EXPECT_EQ(reinterpret_cast<uintptr_t>(b.data()) % (size_t{2} << 20), 0u) << bytes;
    EXPECT_EQ(b.data()[0], 0);
    EXPECT_EQ(b.data()[bytes - 1], 0);
    b.data()[bytes - 1] = 2;
    EXPECT_EQ(b.data()[bytes - 1], 2);
  }
}

TEST(HugePageBufferTest, MoveHandsOverTheMemory) {
  HugePageBuffer a = HugePageBuffer::Allocate(100);
  ASSERT_NE(a.data(), nullptr);
  a.data()[7] = 42;
  uint8_t* const p = a.data();
  HugePageBuffer b = std::move(a);
  EXPECT_EQ(a.data(), nullptr);  // NOLINT(bugprone-use-after-move): moved-from state is defined
  EXPECT_EQ(a.size(), 0u);
  EXPECT_EQ(b.data(), p);
  EXPECT_EQ(b.data()[7], 42);
  HugePageBuffer c;
  c = std::move(b);
  EXPECT_EQ(c.data(), p);
  EXPECT_EQ(c.size(), 100u);
}

TEST(HugePageBufferTest, ReadOnlyStillReads) {
  HugePageBuffer b = HugePageBuffer::Allocate(64);
  ASSERT_NE(b.data(), nullptr);
  b.data()[3] = 9;
  b.MakeReadOnly();
  EXPECT_EQ(b.data()[3], 9);
}

TEST(HugePageBufferTest, AnImpossibleSizeFailsWithNullData) {
  HugePageBuffer b = HugePageBuffer::Allocate(size_t{1} << 62);
  EXPECT_EQ(b.data(), nullptr);
  EXPECT_EQ(b.size(), 0u);
}

}  // namespace
}  // namespace kvllm
