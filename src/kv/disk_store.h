// DiskStore: the disk tier, one file per block in a directory the store owns.
//
//   dir/
//     LOCK                        flock'ed while a store has the directory open
//     ab/abcdef0123456789.kvb     a block, named only by its hash (16 hex digits); the
//                                 first two digits fan the files out over 256 folders
//     ab/abcdef0123456789.kvb.7.tmp   a Put in flight (or one a crash left behind)
//
// Guarantees:
// - Atomic: a Put writes a temp file beside the final one, fsyncs it, renames it over the
//   final name and fsyncs the folder, so a crash (even kill -9) leaves the old block, the new
//   one or a stray temp file, never a partial .kvb. Open removes stray temp files.
// - Bounded: with max_bytes > 0 the .kvb files' sizes add up to at most max_bytes at every
//   moment; a Put evicts the least recently used blocks (Get and Put are uses) to make room
//   before its file appears. Last use is kept in memory and seeded from the files' mtimes at
//   Open.
// - Exclusive: one DiskStore at a time per directory (an flock on dir/LOCK, across threads
//   and processes), so the in-memory index and size stay true. Other files are left alone.
// - Thread-safe: any thread may call any method. The file writes run outside the lock;
//   renames, removals and index updates run under it.
#pragma once

#include <atomic>
#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>

#include "kv/kv_store.h"

namespace kvllm {

class DiskStore final : public KVStore {
 public:
  // Creates `dir` if needed, takes its lock, removes stray temp files and indexes the blocks
  // there (evicting down to max_bytes). max_bytes 0 means unlimited.
  static StatusOr<std::unique_ptr<DiskStore>> Open(std::string dir, uint64_t max_bytes);
  ~DiskStore() override;
  DiskStore(const DiskStore&) = delete;
  DiskStore& operator=(const DiskStore&) = delete;

  const char* name() const override { return "disk"; }
  StatusOr<std::optional<std::vector<uint8_t>>> Get(BlockHash hash) override;
  // Fails when `encoded` alone is larger than max_bytes.
  Status Put(BlockHash hash, std::span<const uint8_t> encoded) override;
  Status Remove(BlockHash hash) override;
  bool Contains(BlockHash hash) override;

  uint64_t bytes() const;  // sum of the indexed blocks' file sizes
  size_t num_blocks() const;
  int64_t evictions() const;
  // The file that holds `hash` (whether or not it exists).
  std::string PathOf(BlockHash hash) const;

 private:
  struct Entry {
    uint64_t bytes = 0;
    std::list<BlockHash>::iterator lru_pos;
  };

  DiskStore(std::string dir, uint64_t max_bytes, int lock_fd);
  Status Scan();
  // These require mu_. Insert adds or replaces `hash` as the most recently used block;
  // Use marks an indexed block most recently used; EvictToFit evicts until `incoming` more
  // bytes fit under max_bytes.
  void Insert(BlockHash hash, uint64_t bytes);
  void Use(BlockHash hash);
  void Forget(BlockHash hash);
  void EvictToFit(uint64_t incoming);

  const std::string dir_;
  const uint64_t max_bytes_;
  const int lock_fd_;

  mutable std::mutex mu_;
  std::unordered_map<BlockHash, Entry> index_;
  std::list<BlockHash> lru_;  // least recently used first
  uint64_t bytes_ = 0;
  int64_t evictions_ = 0;
  std::atomic<uint64_t> next_temp_{0};  // concurrent Puts of one hash use distinct temp files
};

}  // namespace kvllm
