#include "kv/attention_split.h"

#include <algorithm>
#include <atomic>
#include <limits>

#include "base/status.h"

namespace kvllm {
namespace {

// Pieces a thread may take in one call beyond the pairs' own: each halves what is left of a
// pair, so a handful covers any imbalance; past it the threads just finish what they hold.
constexpr int32_t kTakenPerThread = 8;

}  // namespace

void AttentionSplit::Reserve(int32_t max_pairs, int32_t n_threads, int32_t n_group,
                             int32_t head_dim) {
  const int32_t capacity = max_pairs + kTakenPerThread * n_threads;
  n_group_ = n_group;
  head_dim_ = head_dim;
  state_floats_ = AttentionPartFloats(n_group, head_dim);
  if (capacity > capacity_) {
    capacity_ = capacity;
    pieces_ = std::make_unique<Piece[]>(capacity);
    used_ = 0;
    merge_.reserve(capacity);
  }
  states_.resize(static_cast<size_t>(capacity_) * state_floats_);
}

int32_t AttentionSplit::Run(ThreadPool& pool, int32_t n_pairs, ArgsFn args, OutFn out,
                            float* scratch, int64_t scratch_stride) {
  KVLLM_CHECK(n_pairs + kTakenPerThread * pool.size() <= capacity_);
  // Pieces past both this call's pairs and the last call's pieces were left as Reserve made
  // them: unused.
  for (int32_t i = 0; i < std::max(n_pairs, used_); ++i) {
    pieces_[i].pair = i < n_pairs ? i : -1;
    pieces_[i].started.store(false);
    pieces_[i].claim.Set(0, 0);
  }
  auto state = [&](int32_t piece) { return &states_[piece * state_floats_]; };
  std::atomic<int32_t> n_pieces{n_pairs}, taken{0};

  // The first unstarted pair from `from` on (wrapping), marked started; -1 when none is left.
  auto start_pair = [&](int32_t from) {
    for (int32_t i = 0; i < n_pairs; ++i) {
      const int32_t pair = (from + i) % n_pairs;
      if (!pieces_[pair].started.load() && !pieces_[pair].started.exchange(true)) return pair;
    }
    return -1;
  };
  auto attend_pair = [&](int32_t pair, int thread) {
    const AttentionArgs a = args(pair, thread);
    float* s = scratch + thread * scratch_stride;
    if (a.n_spans == 1) {
      pieces_[pair].claim.Set(a.spans[0].begin, a.spans[0].end);
      AttendGroupClaimed(a, pieces_[pair].claim, state(pair), s);
    } else {
      AttendGroupPart(a, 0, std::numeric_limits<int32_t>::max(), state(pair), s);
    }
  };
  // Until nothing of two chunks is left: the back half of the piece with the most left.
  auto take_from_others = [&](int thread) {
    for (;;) {
      int32_t from = -1, most = 0;
      const int32_t n = std::min(n_pieces.load(), capacity_);
      for (int32_t i = 0; i < n; ++i) {
        const int32_t left = pieces_[i].claim.Unclaimed();
        if (left > most) {
          from = i;
          most = left;
        }
      }
      if (from < 0) return;
      const int32_t piece = n_pieces.fetch_add(1);
      if (piece >= capacity_) return;
      // A piece's pair is written before its claim is set, and read after seeing it set.
      const int32_t pair = pieces_[from].pair;
      const AttentionArgs a = args(pair, thread);
      int32_t begin = 0, end = 0;
      if (!pieces_[from].claim.TakeBackHalf(a.kv->layout().block_size(), &begin, &end)) return;
      pieces_[piece].pair = pair;
      pieces_[piece].claim.Set(begin, end);
      AttendGroupClaimed(a, pieces_[piece].claim, state(piece), scratch + thread * scratch_stride);
      taken.fetch_add(1);
    }
  };

  // A task a thread: it starts on the first pair of its share and goes on to the next
  // unstarted one, so each thread streams through adjacent heads' regions of the cache while
  // there are whole pairs to run; then it takes from the others.
  const int n_tasks = pool.size();
  pool.ParallelFor(n_tasks, [&](int64_t task, int thread) {
    int32_t from = static_cast<int32_t>(n_pairs * task / n_tasks);
    for (int32_t pair; (pair = start_pair(from)) >= 0; from = pair + 1) attend_pair(pair, thread);
    take_from_others(thread);
  });

  const int32_t n = std::min(n_pieces.load(), capacity_);
  used_ = n;
  for (int32_t pair = 0; pair < n_pairs; ++pair) {
    merge_.assign(1, state(pair));
    for (int32_t i = n_pairs; i < n; ++i) {
      if (pieces_[i].pair == pair) merge_.push_back(state(i));
    }
    MergeAttentionParts(merge_.data(), static_cast<int32_t>(merge_.size()), n_group_, head_dim_,
                        out(pair));
  }
  return taken.load();
}

}  // namespace kvllm
