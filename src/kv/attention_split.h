// AttentionSplit: one layer's attention of a few (token, KV head) pairs shared by the threads
// of a pool, split where it needs to be while it runs, not before.
//
// Each thread starts on the first pair of a contiguous share and goes on to the next pair no
// thread has started, so that it streams through adjacent heads' regions of the cache. Inside
// a pair, it takes the slots a chunk at a time from a SlotClaim (attention.h); once every pair
// has been started, a thread with nothing left takes the back half of what is unclaimed in the
// piece with the most left, and again, until nothing of two chunks or more is left. Whole
// pairs a thread left threads idle: a batch of a sequence at 4,096 tokens and one at 256 on
// two threads was two tasks, and the second thread waited through most of the first one's
// heads (now half the time). With one sequence the threads finish closer together, but the
// half taken starts cold and a step was no faster (docs/performance.md, "Attention shared
// while it runs"). Every piece leaves its softmax unnormalised (AttendGroupPart's form), and
// a pair's pieces are merged once all have run.
//
// A pair of two spans (attention sinks and a window) is attended whole by one thread.
// Nothing is allocated per call once Reserve has sized the buffers.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <vector>

#include "base/function_ref.h"
#include "kv/attention.h"
#include "tensor/thread_pool.h"

namespace kvllm {

class AttentionSplit {
 public:
  // A pair's arguments, for a thread (whose scratch may hold a rotated query for sinks).
  using ArgsFn = FunctionRef<AttentionArgs(int32_t pair, int thread)>;
  // Where a pair's [n_group][head_dim] result goes.
  using OutFn = FunctionRef<float*(int32_t pair)>;

  // Sizes the buffers for up to max_pairs pairs on n_threads threads.
  void Reserve(int32_t max_pairs, int32_t n_threads, int32_t n_group, int32_t head_dim);

  // Attends pairs [0, n_pairs) (n_pairs <= the reserved max_pairs, threads <= n_threads).
  // Thread t's scratch (AttentionScratchFloats) is scratch + t * scratch_stride. Returns how
  // many pieces were taken from other threads' pairs.
  int32_t Run(ThreadPool& pool, int32_t n_pairs, ArgsFn args, OutFn out, float* scratch,
              int64_t scratch_stride);

 private:
  struct alignas(64) Piece {  // a line each: each chunk taken writes the claim
    int32_t pair = -1;  // -1: unused
    std::atomic<bool> started{false};  // a pair's own piece: a thread has taken it
    SlotClaim claim;
  };
  // Pieces [0, pairs) are the pairs' own; taken ones follow, up to the capacity.
  std::unique_ptr<Piece[]> pieces_;
  int32_t capacity_ = 0;
  int32_t used_ = 0;  // pieces the last call touched: the ones Run must reset
  std::vector<float> states_;  // [capacity_][AttentionPartFloats]
  int64_t state_floats_ = 0;
  int32_t n_group_ = 0, head_dim_ = 0;
  std::vector<const float*> merge_;  // a pair's pieces, for the merge
};

}  // namespace kvllm
