#include "kv/disk_store.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <thread>
#include <vector>

#include "kv/block_record.h"

namespace kvllm {
namespace {

namespace fs = std::filesystem;

// A fresh directory, removed with everything in it when the object goes.
class TempDir {
 public:
  TempDir() {
    std::string pattern = (fs::temp_directory_path() / "kvllm-disk-store-XXXXXX").string();
    KVLLM_CHECK(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path_, ec);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

// An encoded block named `hash` with `data_bytes` bytes of `fill`.
std::vector<uint8_t> Block(BlockHash hash, size_t data_bytes, uint8_t fill = 7) {
  BlockRecord r;
  r.hash = hash;
  r.model_identity = 99;
  r.k_format = "f16";
  r.v_format = "f16";
  r.block_size = 4;
  r.tokens = {1, 2, 3, 4};
  r.data.assign(data_bytes, fill);
  return EncodeBlock(r);
}

std::unique_ptr<DiskStore> OpenStore(const std::string& dir, uint64_t max_bytes) {
  auto store = DiskStore::Open(dir, max_bytes);
  KVLLM_CHECK(store.ok());
  return std::move(store).value();
}

std::vector<uint8_t> MustGet(KVStore& store, BlockHash hash) {
  auto got = store.Get(hash);
  EXPECT_TRUE(got.ok()) << got.status().message();
  if (!got.ok() || !got->has_value()) return {};
  return **got;
}

// Files under `dir` whose names end with `suffix`, and their total size.
std::pair<int, uint64_t> CountFiles(const std::string& dir, const std::string& suffix) {
  std::pair<int, uint64_t> n{0, 0};
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.is_regular_file() && e.path().string().ends_with(suffix)) {
      ++n.first;
      n.second += e.file_size();
    }
  }
  return n;
}

TEST(DiskStoreTest, PutGetMissRemove) {
  TempDir dir;
  auto store = OpenStore(dir.path() + "/nested/store", 0);  // creates missing folders
  EXPECT_STREQ(store->name(), "disk");
  const BlockHash h = 0xabcdef0123456789;
  EXPECT_EQ(store->PathOf(h), dir.path() + "/nested/store/ab/abcdef0123456789.kvb");

  auto miss = store->Get(h);
  ASSERT_TRUE(miss.ok());
  EXPECT_FALSE(miss->has_value());
  EXPECT_FALSE(store->Contains(h));

  const std::vector<uint8_t> bytes = Block(h, 100);
  ASSERT_TRUE(store->Put(h, bytes).ok());
  EXPECT_TRUE(store->Contains(h));
  EXPECT_EQ(MustGet(*store, h), bytes);
  EXPECT_TRUE(fs::exists(store->PathOf(h)));
  EXPECT_EQ(store->bytes(), bytes.size());
  EXPECT_EQ(store->num_blocks(), 1u);

  ASSERT_TRUE(store->Remove(h).ok());
  EXPECT_FALSE(store->Contains(h));
  EXPECT_FALSE(fs::exists(store->PathOf(h)));
  EXPECT_TRUE(MustGet(*store, h).empty());
  EXPECT_EQ(store->bytes(), 0u);
  EXPECT_TRUE(store->Remove(h).ok());  // absent: still OK
}

TEST(DiskStoreTest, PutReplacesAtomicallyAndLeavesNoTempFile) {
  TempDir dir;
  auto store = OpenStore(dir.path(), 0);
  const std::vector<uint8_t> a = Block(5, 100, 1), b = Block(5, 40, 2);
  ASSERT_TRUE(store->Put(5, a).ok());
  ASSERT_TRUE(store->Put(5, b).ok());
  EXPECT_EQ(MustGet(*store, 5), b);
  EXPECT_EQ(store->bytes(), b.size());
  EXPECT_EQ(store->num_blocks(), 1u);
  EXPECT_EQ(CountFiles(dir.path(), ".tmp").first, 0);
}

TEST(DiskStoreTest, EvictsLeastRecentlyUsedToStayUnderTheLimit) {
  TempDir dir;
  const size_t one = Block(0, 100).size();
  auto store = OpenStore(dir.path(), 3 * one);
  for (BlockHash h : {1, 2, 3}) ASSERT_TRUE(store->Put(h, Block(h, 100)).ok());
  EXPECT_EQ(store->evictions(), 0);
  EXPECT_EQ(MustGet(*store, 1).size(), one);  // 1 is now the most recently used
  ASSERT_TRUE(store->Put(4, Block(4, 100)).ok());
  EXPECT_EQ(store->evictions(), 1);
  EXPECT_TRUE(store->Contains(1));
  EXPECT_FALSE(store->Contains(2));
  EXPECT_FALSE(fs::exists(store->PathOf(2)));
  EXPECT_TRUE(store->Contains(3));
  EXPECT_TRUE(store->Contains(4));
  EXPECT_EQ(store->bytes(), 3 * one);
  EXPECT_EQ(CountFiles(dir.path(), ".kvb"), std::pair(3, uint64_t{3 * one}));

  const Status too_big = store->Put(9, Block(9, 4 * one));
  EXPECT_FALSE(too_big.ok());
  EXPECT_NE(too_big.message().find("exceeds"), std::string::npos) << too_big.message();
  EXPECT_EQ(store->num_blocks(), 3u);
}

TEST(DiskStoreTest, ReopenKeepsBlocksAndSeedsRecencyFromMtimes) {
  TempDir dir;
  const size_t one = Block(0, 100).size();
  {
    auto store = OpenStore(dir.path(), 0);
    for (BlockHash h : {1, 2, 3}) ASSERT_TRUE(store->Put(h, Block(h, 100)).ok());
    // Last used: 3 long ago, then 1, then 2.
    const std::pair<BlockHash, time_t> ages[] = {{3, 1000}, {1, 2000}, {2, 3000}};
    for (const auto& [h, when] : ages) {
      const timespec times[2] = {{when, 0}, {when, 0}};
      ASSERT_EQ(utimensat(AT_FDCWD, store->PathOf(h).c_str(), times, 0), 0);
    }
  }
  auto store = OpenStore(dir.path(), 2 * one);  // room for two: the oldest goes at open
  EXPECT_EQ(store->num_blocks(), 2u);
  EXPECT_FALSE(store->Contains(3));
  EXPECT_EQ(MustGet(*store, 1), Block(1, 100));
  EXPECT_EQ(MustGet(*store, 2), Block(2, 100));
  ASSERT_TRUE(store->Put(4, Block(4, 100)).ok());  // 1 was used before 2
  EXPECT_FALSE(store->Contains(1));
  EXPECT_TRUE(store->Contains(2));
}

TEST(DiskStoreTest, OpenRemovesStrayTempFilesAndLeavesOtherFilesAlone) {
  TempDir dir;
  fs::create_directories(dir.path() + "/ab");
  const std::string temp = dir.path() + "/ab/abcdef0123456789.kvb.3.tmp";
  const std::string others[] = {dir.path() + "/README", dir.path() + "/ab/notes.txt",
                                dir.path() + "/ab/ABCDEF0123456789.kvb",
                                dir.path() + "/ab/cdef0123456789ab.kvb"};  // wrong folder
  for (const std::string& path : others) std::ofstream(path) << "x";
  std::ofstream(temp) << "half a block";
  std::ofstream(dir.path() + "/cd") << "a file where a folder could be";
  auto store = OpenStore(dir.path(), 0);
  EXPECT_FALSE(fs::exists(temp));
  for (const std::string& path : others) EXPECT_TRUE(fs::exists(path)) << path;
  EXPECT_EQ(store->num_blocks(), 0u);
}

TEST(DiskStoreTest, OneStorePerDirectory) {
  TempDir dir;
  auto first = OpenStore(dir.path(), 0);
  auto second = DiskStore::Open(dir.path(), 0);
  ASSERT_FALSE(second.ok());
  EXPECT_NE(second.status().message().find("in use"), std::string::npos)
      << second.status().message();
  first.reset();
  EXPECT_TRUE(DiskStore::Open(dir.path(), 0).ok());
}

TEST(DiskStoreTest, OpenFailsClearlyWhereNoDirectoryCanBe) {
  TempDir dir;
  std::ofstream(dir.path() + "/file") << "x";
  auto store = DiskStore::Open(dir.path() + "/file/store", 0);
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("cannot create KV store directory"), std::string::npos)
      << store.status().message();
}

TEST(DiskStoreTest, ConcurrentPutsGetsAndRemoves) {
  TempDir dir;
  constexpr int kThreads = 4, kOps = 400, kHashes = 24;
  const size_t one = Block(0, 512).size();
  auto store = OpenStore(dir.path(), 10 * one);  // fewer slots than hashes: evictions race
  std::vector<std::thread> threads;
  std::atomic<int> failures{0};
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kOps; ++i) {
        const BlockHash h = 1 + (i * 7 + t * 13) % kHashes;
        const int op = (i + t) % 5;
        if (op == 0) {
          failures += !store->Remove(h).ok();
        } else if (op <= 2) {
          failures += !store->Put(h, Block(h, 512, static_cast<uint8_t>(t))).ok();
        } else {
          auto got = store->Get(h);
          if (!got.ok()) {
            ++failures;
          } else if (got->has_value()) {
            // Whole blocks only: a hit decodes and is the block asked for.
            auto record = DecodeBlock(**got);
            failures += !record.ok() || record->hash != h;
          }
        }
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
  EXPECT_LE(store->bytes(), 10 * one);
  EXPECT_EQ(CountFiles(dir.path(), ".kvb"),
            std::pair(static_cast<int>(store->num_blocks()), store->bytes()));
  EXPECT_EQ(CountFiles(dir.path(), ".tmp").first, 0);
}

// A writer killed with SIGKILL at a random point leaves no partial block: every .kvb decodes,
// and the next Open sweeps the temp file it may have left.
TEST(DiskStoreTest, KillNineMidWriteLeavesNoPartialBlock) {
  TempDir dir;
  for (int round = 0; round < 4; ++round) {
    const pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
      auto store = DiskStore::Open(dir.path(), 0);
      for (uint64_t i = 0; store.ok(); ++i) {
        (void)(*store)->Put(1 + i % 8, Block(1 + i % 8, 1 << 20, static_cast<uint8_t>(i)));
      }
      _exit(1);
    }
    // Let it write a few blocks, then kill it somewhere inside one.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (CountFiles(dir.path(), ".kvb").first < 2 &&
           std::chrono::steady_clock::now() < deadline) {
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(3 * round));
    kill(child, SIGKILL);
    int status = 0;
    ASSERT_EQ(waitpid(child, &status, 0), child);
    ASSERT_TRUE(WIFSIGNALED(status));

    auto store = OpenStore(dir.path(), 0);
    EXPECT_EQ(CountFiles(dir.path(), ".tmp").first, 0);
    EXPECT_GE(store->num_blocks(), 2u);
    for (BlockHash h = 1; h <= 8; ++h) {
      const std::vector<uint8_t> bytes = MustGet(*store, h);
      if (bytes.empty()) continue;
      const auto record = DecodeBlock(bytes);
      EXPECT_TRUE(record.ok()) << "round " << round << " block " << h << ": "
                               << record.status().message();
    }
  }
}

}  // namespace
}  // namespace kvllm
