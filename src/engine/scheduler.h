// Scheduler: continuous batching. Sequences wait in a FIFO queue and run in a list ordered
// by admission. Every step hands out a token budget:
//
//   1. each running sequence that decodes gets its one token;
//   2. each running sequence still prefilling gets the next chunk of its prompt;
//   3. waiting sequences are admitted, oldest first, while the budget, --max-num-seqs and the
//      KV pool allow: each first reuses its longest cached prefix and then gets a chunk.
//
// The chosen tokens' KV slots are reserved here (plan, then the model fills them). When the
// pool runs dry, the newest running sequence is preempted: its blocks are released (its full
// blocks stay in the prefix cache) and it goes back to the front of the queue, to be
// recomputed later. A sequence that cannot grow even alone finishes with kContext.
//
// Bookkeeping only: never touches a tensor. Not thread-safe: the Engine owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "engine/request.h"
#include "kv/kv_cache.h"

namespace kvllm {

struct SchedulerOptions {
  int32_t max_num_seqs = 64;              // running sequences at most
  int32_t max_num_batched_tokens = 2048;  // tokens per step (decode + prefill chunks)
  bool kv_cache = true;     // false: every step recomputes a sequence's whole history
  // > 0: each admitted sequence reserves this many token slots up front, as a server that
  // allocates the whole context per request does (the comparison baseline for paging).
  int32_t reserve_tokens = 0;
};

struct ScheduledChunk {
  Sequence* seq;
  int32_t n_tokens;  // computes tokens [seq->n_cached, seq->n_cached + n_tokens)
};

struct SchedulerCounters {
  int64_t preemptions = 0;
  int64_t prefix_queries = 0;  // prompt tokens looked up in the prefix cache
  int64_t prefix_hits = 0;     // of those, found
};

class Scheduler {
 public:
  Scheduler(const SchedulerOptions& options, KVCache* kv);

  void AddWaiting(Sequence* seq);
  // A forked sequence, already holding its cache: runs from the next step.
  void AddRunning(Sequence* seq);
  // Forgets a sequence (finished or cancelled); its cache is the caller's to free.
  void Remove(Sequence* seq);

  // Plans one step into *plan (cleared first; a vector kept across steps keeps its capacity,
  // so a step allocates nothing). Sequences that can never fit get finish = kContext and are
  // removed. `ctx_limit`: the most tokens a sequence may hold.
  void Schedule(int64_t ctx_limit, std::vector<ScheduledChunk>* plan);

  int32_t num_running() const { return static_cast<int32_t>(running_.size()); }
  int32_t num_waiting() const { return static_cast<int32_t>(waiting_.size()); }
  const std::vector<Sequence*>& running() const { return running_; }
  const std::deque<Sequence*>& waiting() const { return waiting_; }
  const SchedulerCounters& counters() const { return counters_; }
  const SchedulerOptions& options() const { return options_; }
  // Blocks reserved by the reserve_tokens policy (0 when paging).
  int32_t reserved_blocks() const { return reserved_blocks_; }

 private:
  int32_t ReserveBlocks() const;
  void Preempt(Sequence* seq);
  // Reserves n_new slots for `seq`, preempting newer running sequences until they fit.
  // False when `seq` itself had to go.
  bool GrowOrPreempt(Sequence* seq, int32_t n_new, std::vector<ScheduledChunk>* plan);

  SchedulerOptions options_;
  KVCache* kv_;
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;  // by admission, oldest first
  std::vector<Sequence*> snapshot_;  // Schedule's copy of running_ for one pass
  SchedulerCounters counters_;
  int32_t reserved_blocks_ = 0;
};

}  // namespace kvllm
