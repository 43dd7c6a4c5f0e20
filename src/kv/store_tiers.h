// StoreTiers: the persistent tiers below the in-memory prefix cache, in order (disk, then
// Redis, ...). The KV cache hands every newly cached full block to Write(), which copies it
// to a queue; a background thread writes it to each tier that lacks it, off the step loop.
// A prefix miss in memory asks Read(), tier by tier, for the next block of the chain; a stored
// block is used only if it decodes, names this model, formats and block size, and holds the
// expected hash, parent and tokens. Anything else is removed from its tier with a warning and
// counts as a miss: the block is recomputed. A tier that fails (Redis down) is a miss too.
//
// Thread-safe: the engine thread reads and queues, the writer thread writes.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "kv/block_record.h"
#include "kv/kv_store.h"

namespace kvllm {

struct TierStats {
  std::string name;
  int64_t hits = 0;      // blocks read and used
  int64_t misses = 0;
  int64_t errors = 0;    // the tier failed (counted as misses too)
  int64_t rejected = 0;  // stored blocks that failed a check and were removed
  int64_t writes = 0;    // blocks written
};

class StoreTiers {
 public:
  StoreTiers(BlockIdentity identity, std::vector<std::unique_ptr<KVStore>> tiers,
             size_t max_queue = 1024);
  ~StoreTiers();  // writes what is queued, then stops
  StoreTiers(const StoreTiers&) = delete;
  StoreTiers& operator=(const StoreTiers&) = delete;

  const BlockIdentity& identity() const { return identity_; }
  // Queues a full block for the tiers; dropped (counted) when the queue is full.
  void Write(BlockRecord record);
  // The stored block `hash` whose parent and tokens are the expected ones, from the first tier
  // that has a valid one; `tier` gets that tier's index.
  std::optional<BlockRecord> Read(BlockHash hash, BlockHash parent,
                                  std::span<const int32_t> tokens, int* tier = nullptr);
  // Waits until every queued block is written.
  void Flush();
  // Blocks queued or being written.
  size_t pending() const;
  std::vector<TierStats> stats() const;
  int64_t dropped() const;

 private:
  void Run();

  BlockIdentity identity_;
  std::vector<std::unique_ptr<KVStore>> tiers_;
  size_t max_queue_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<BlockRecord> queue_;
  bool writing_ = false;
  bool stopping_ = false;
  int64_t dropped_ = 0;
  std::vector<TierStats> stats_;
  std::thread writer_;
};

}  // namespace kvllm
