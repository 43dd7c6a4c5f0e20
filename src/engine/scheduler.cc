#include "engine/scheduler.h"

#include <algorithm>

namespace kvllm {

Scheduler::Scheduler(const SchedulerOptions& options, KVCache* kv) : options_(options), kv_(kv) {}

void Scheduler::AddWaiting(Sequence* seq) { waiting_.push_back(seq); }

void Scheduler::AddRunning(Sequence* seq) { running_.push_back(seq); }

int32_t Scheduler::ReserveBlocks() const {
  return (options_.reserve_tokens + kv_->block_size() - 1) / kv_->block_size();
}

void Scheduler::Remove(Sequence* seq) {
  auto it = std::find(running_.begin(), running_.end(), seq);
  if (it != running_.end()) {
    running_.erase(it);
    reserved_blocks_ -= ReserveBlocks();
  }
  std::erase(waiting_, seq);
}

void Scheduler::Preempt(Sequence* seq) {
  kv_->Free(seq->id);
  seq->n_cached = 0;
  Remove(seq);
  waiting_.push_front(seq);
  ++seq->preemptions;
  ++counters_.preemptions;
}

bool Scheduler::GrowOrPreempt(Sequence* seq, int32_t n_new, std::vector<ScheduledChunk>* plan) {
  while (!kv_->CanAppend(seq->id, n_new)) {
    Sequence* victim = running_.back();
    if (victim == seq) {
      if (running_.size() == 1) {
        // Alone and still no room: it never will have any.
        seq->finish = FinishReason::kContext;
        Remove(seq);
      } else {
        Preempt(seq);
      }
      return false;
    }
    std::erase_if(*plan, [victim](const ScheduledChunk& c) { return c.seq == victim; });
    Preempt(victim);
  }
  kv_->Append(seq->id, n_new);
  return true;
}

void Scheduler::Schedule(int64_t ctx_limit, std::vector<ScheduledChunk>* plan) {
  plan->clear();
  int64_t budget = options_.max_num_batched_tokens;
  if (!options_.kv_cache) {
    for (Sequence* s : running_) {
      kv_->Free(s->id);
      s->n_cached = 0;
    }
  }
  const int64_t preemptions_before = counters_.preemptions;
  // Pass 0: decodes (one token left to compute); pass 1: prefill chunks.
  for (int pass = 0; pass < 2; ++pass) {
    snapshot_.assign(running_.begin(), running_.end());
    for (Sequence* s : snapshot_) {
      if (std::find(running_.begin(), running_.end(), s) == running_.end()) continue;  // preempted
      const auto total = static_cast<int32_t>(s->tokens.size());
      const int32_t remaining = total - s->n_cached;
      if ((remaining == 1) != (pass == 0) || budget <= 0) continue;
      if (total > ctx_limit) {
        s->finish = FinishReason::kContext;
        Remove(s);
        continue;
      }
      const int32_t n = options_.kv_cache
                            ? static_cast<int32_t>(std::min<int64_t>(remaining, budget))
                            : remaining;
      if (GrowOrPreempt(s, n, plan)) {
        plan->push_back({s, n});
        budget -= n;
      }
    }
  }
  if (counters_.preemptions != preemptions_before) return;

  while (!waiting_.empty() && budget > 0 &&
         static_cast<int32_t>(running_.size()) < options_.max_num_seqs) {
    Sequence* s = waiting_.front();
    const auto total = static_cast<int32_t>(s->tokens.size());
    if (total > ctx_limit) {
      s->finish = FinishReason::kContext;
      waiting_.pop_front();
      continue;
    }
    if (options_.reserve_tokens > 0 && reserved_blocks_ + ReserveBlocks() > kv_->num_blocks()) {
      break;
    }
    const bool attached = !kv_->Has(s->id);
    if (attached) {
      const bool lookup = options_.kv_cache && s->reuse_prefix;
      const PrefixMatch m =
          kv_->AttachPrefix(s->id, s->tokens, lookup ? total - 1 : 0);
      if (lookup && kv_->prefix_cache_enabled()) {
        counters_.prefix_queries += total;
        counters_.prefix_hits += m.tokens;
      }
      if (!s->prefix_looked_up) {
        s->prefix = m;
        s->prefix_looked_up = true;
      }
      s->n_cached = m.tokens;
    }
    const int32_t remaining = total - s->n_cached;
    const int32_t n = options_.kv_cache ? static_cast<int32_t>(std::min<int64_t>(remaining, budget))
                                        : remaining;
    if (!kv_->CanAppend(s->id, n)) {
      if (running_.empty() && kv_->BlocksNeeded(s->id, n) > kv_->available_blocks()) {
        // Nothing runs that could make room: this one cannot fit.
        s->finish = FinishReason::kContext;
        waiting_.pop_front();
      }
      if (attached) {
        kv_->Free(s->id);
        s->n_cached = 0;
      }
      if (s->finished()) continue;
      break;
    }
    kv_->Append(s->id, n);
    plan->push_back({s, n});
    budget -= n;
    waiting_.pop_front();
    running_.push_back(s);
    reserved_blocks_ += options_.reserve_tokens > 0 ? ReserveBlocks() : 0;
  }
}

}  // namespace kvllm
