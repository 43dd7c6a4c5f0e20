#include "kv/store_tiers.h"

#include <algorithm>
#include <cstdio>

namespace kvllm {

StoreTiers::StoreTiers(BlockIdentity identity, std::vector<std::unique_ptr<KVStore>> tiers,
                       size_t max_queue)
    : identity_(std::move(identity)), tiers_(std::move(tiers)), max_queue_(max_queue) {
  for (const auto& t : tiers_) stats_.push_back(TierStats{t->name()});
  writer_ = std::thread([this] { Run(); });
}

StoreTiers::~StoreTiers() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  writer_.join();
}

void StoreTiers::Write(BlockRecord record) {
  {
    std::lock_guard lock(mu_);
    if (queue_.size() >= max_queue_) {
      ++dropped_;
      return;
    }
    queue_.push_back(std::move(record));
  }
  cv_.notify_all();
}

void StoreTiers::Run() {
  std::unique_lock lock(mu_);
  while (true) {
    cv_.wait(lock, [&] { return stopping_ || !queue_.empty(); });
    if (queue_.empty()) break;  // stopping with nothing left to write
    BlockRecord r = std::move(queue_.front());
    queue_.pop_front();
    writing_ = true;
    lock.unlock();
    const std::vector<uint8_t> bytes = EncodeBlock(r);
    std::vector<bool> wrote(tiers_.size(), false), failed(tiers_.size(), false);
    for (size_t i = 0; i < tiers_.size(); ++i) {
      if (tiers_[i]->Contains(r.hash)) continue;
      const Status s = tiers_[i]->Put(r.hash, bytes);
      (s.ok() ? wrote : failed)[i] = true;
    }
    lock.lock();
    for (size_t i = 0; i < tiers_.size(); ++i) {
      stats_[i].writes += wrote[i] ? 1 : 0;
      stats_[i].errors += failed[i] ? 1 : 0;
    }
    writing_ = false;
    cv_.notify_all();
  }
}

void StoreTiers::Flush() {
  std::unique_lock lock(mu_);
  cv_.wait(lock, [&] { return queue_.empty() && !writing_; });
}

std::optional<BlockRecord> StoreTiers::Read(BlockHash hash, BlockHash parent,
                                            std::span<const int32_t> tokens, int* tier) {
  for (size_t i = 0; i < tiers_.size(); ++i) {
    KVStore& store = *tiers_[i];
    auto got = store.Get(hash);
    std::lock_guard lock(mu_);
    TierStats& st = stats_[i];
    if (!got.ok()) {
      ++st.errors;
      ++st.misses;
      continue;
    }
    if (!got->has_value()) {
      ++st.misses;
      continue;
    }
    StatusOr<BlockRecord> r = DecodeBlock(**got);
    Status problem = r.ok() ? CheckIdentity(*r, identity_) : r.status();
    if (problem.ok() && (r->hash != hash || r->parent != parent ||
                         !std::equal(tokens.begin(), tokens.end(), r->tokens.begin(),
                                     r->tokens.end()))) {
      problem = Status::Error("it holds another block than its key names");
    }
    if (!problem.ok()) {
      std::fprintf(stderr, "kvllm: warning: %s tier: stored KV block %016llx is unusable (%s); "
                           "removed, it will be recomputed\n",
                   store.name(), static_cast<unsigned long long>(hash), problem.message().c_str());
      (void)store.Remove(hash);
      ++st.rejected;
      ++st.misses;
      continue;
    }
    ++st.hits;
    if (tier != nullptr) *tier = static_cast<int>(i);
    return std::move(*r);
  }
  return std::nullopt;
}

std::vector<TierStats> StoreTiers::stats() const {
  std::lock_guard lock(mu_);
  return stats_;
}

size_t StoreTiers::pending() const {
  std::lock_guard lock(mu_);
  return queue_.size() + (writing_ ? 1 : 0);
}

int64_t StoreTiers::dropped() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

}  // namespace kvllm
