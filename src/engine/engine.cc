#include "engine/engine.h"

#include <algorithm>
#include <cstdio>
#include <limits>
#include <span>

#include "kv/disk_store.h"
#include "kv/redis_store.h"

namespace kvllm {

const char* FinishReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kNone: return "none";
    case FinishReason::kLength: return "length";
    case FinishReason::kStop: return "stop";
    case FinishReason::kContext: return "context";
    case FinishReason::kAbort: return "abort";
  }
  return "?";
}

StatusOr<std::unique_ptr<Engine>> Engine::Create(Model* model, const EngineOptions& options) {
  EngineOptions opts = options;
  if (opts.ctx_size <= 0) opts.ctx_size = model->config().n_ctx_train;
  KVLLM_ASSIGN_OR_RETURN(KVLayout layout, KVLayout::Make(model->kv_shape(), opts.block_size,
                                                         opts.k_type, opts.v_type));
  const int32_t num_blocks = (opts.ctx_size + opts.block_size - 1) / opts.block_size;
  if (opts.kv_window < 0 || opts.kv_sinks < 0) {
    return Status::Error("--kv-window and --kv-sinks must not be negative");
  }
  if (opts.scheduler.max_num_seqs < 1 || opts.scheduler.max_num_batched_tokens < 1) {
    return Status::Error("--max-num-seqs and --max-num-batched-tokens must be at least 1");
  }
  if (opts.kv_window == 0) {
    opts.kv_window = model->config().sliding_window;
    opts.kv_sinks = 0;
  }
  opts.scheduler.kv_cache = opts.kv_cache;
  auto kv = std::make_unique<KVCache>(layout, num_blocks, KVWindow{opts.kv_window, opts.kv_sinks});
  if (opts.prefix_caching && opts.kv_cache) kv->EnablePrefixCache(model->identity());
  opts.prefix_caching = kv->prefix_cache_enabled();
  std::unique_ptr<StoreTiers> store;
  if (!opts.kv_store_dir.empty() || !opts.kv_store_redis.empty()) {
    if (!opts.prefix_caching) {
      return Status::Error("--kv-store-dir and --kv-store-redis need the prefix cache (no "
                           "--no-prefix-caching, --no-kv-cache or --kv-window)");
    }
    std::vector<std::unique_ptr<KVStore>> tiers;
    if (!opts.kv_store_dir.empty()) {
      auto disk = DiskStore::Open(opts.kv_store_dir, opts.kv_store_dir_bytes);
      if (!disk.ok()) return Status::Error("--kv-store-dir: " + disk.status().message());
      tiers.push_back(std::move(*disk));
    }
    if (!opts.kv_store_redis.empty()) {
      auto redis = RedisStore::Connect(opts.kv_store_redis);
      if (redis.ok()) {
        tiers.push_back(std::move(*redis));
      } else {
        std::fprintf(stderr, "kvllm: warning: --kv-store-redis: %s; running without it\n",
                     redis.status().message().c_str());
      }
    }
    if (!tiers.empty()) {
      store = std::make_unique<StoreTiers>(kv->block_identity(), std::move(tiers));
      kv->AttachStore(store.get());
    }
  }
  return std::unique_ptr<Engine>(new Engine(model, opts, std::move(store), std::move(kv)));
}

Engine::Engine(Model* model, const EngineOptions& options, std::unique_ptr<StoreTiers> store,
               std::unique_ptr<KVCache> kv)
    : model_(model),
      options_(options),
      store_(std::move(store)),
      kv_(std::move(kv)),
      scheduler_(options.scheduler, kv_.get()),
      pool_(options.n_threads) {}

Status Engine::ValidateTokens(const std::vector<int32_t>& tokens) const {
  const int32_t n_vocab = model_->config().n_vocab;
  for (int32_t t : tokens) {
    if (t < 0 || t >= n_vocab) {
      return Status::Error("token id " + std::to_string(t) + " is outside the vocabulary (0.." +
                           std::to_string(n_vocab - 1) + ")");
    }
  }
  // Room for the tokens and at least the first generated token's K/V is needed.
  const auto n = static_cast<int64_t>(tokens.size());
  const int64_t limit = std::min<int64_t>(kv_->capacity_tokens(), options_.ctx_size);
  if (n >= limit) {
    return Status::Error("the prompt has " + std::to_string(n) +
                         " tokens but the KV cache holds " + std::to_string(limit) +
                         " (-c/--ctx-size); shorten the prompt or raise the context size");
  }
  return Status::Ok();
}

int64_t Engine::ContextLimit() const {
  // With a window and the cache, old blocks are released as the sequence grows: only the pool
  // bounds it. Otherwise every position needs its slot.
  const bool bounded = !(kv_->window().enabled() && options_.kv_cache);
  return bounded ? std::min<int64_t>(kv_->capacity_tokens(), options_.ctx_size)
                 : std::numeric_limits<int32_t>::max();
}

StatusOr<SeqId> Engine::Add(Request request) {
  if (request.prompt.empty()) return Status::Error("the prompt is empty");
  if (request.n < 1) return Status::Error("n must be at least 1");
  KVLLM_RETURN_IF_ERROR(ValidateTokens(request.prompt));
  const auto now = SequenceTimings::Clock::now();
  const SeqId first(next_seq_);
  Sequence* leader = nullptr;
  for (int32_t i = 0; i < request.n; ++i) {
    Request r{request.prompt, request.params, 1};
    uint64_t& seed = r.params.sampling.seed;
    if (seed != SamplingParams::kRandomSeed) seed += static_cast<uint64_t>(i);
    seqs_.push_back(std::make_unique<Sequence>(SeqId(next_seq_++), std::move(r)));
    Sequence* s = seqs_.back().get();
    s->timings.arrival = now;
    if (leader == nullptr) {
      leader = s;
      scheduler_.AddWaiting(s);
    } else {
      s->fork_of = leader;
      leader->pending_forks.push_back(s);
    }
  }
  return first;
}

bool Engine::HasUnfinished() const {
  return std::any_of(seqs_.begin(), seqs_.end(), [](const auto& s) { return !s->finished(); });
}

void Engine::Step(std::vector<TokenEvent>* events) {
  batch_.Clear();
  batch_seqs_.clear();
  scheduler_.Schedule(ContextLimit(), &chunks_);
  if (chunks_.empty()) return;
  for (const ScheduledChunk& c : chunks_) {
    Sequence& s = *c.seq;
    const int32_t end = s.n_cached + c.n_tokens;
    const auto total = static_cast<int32_t>(s.tokens.size());
    for (int32_t i = s.n_cached; i < end; ++i) {
      batch_.Add(s.tokens[i], /*pos=*/i, s.id, /*want_logits=*/i == total - 1);
    }
    if (end == total) batch_seqs_.push_back(&s);
  }

  const int32_t n_vocab = model_->config().n_vocab;
  logits_.resize(batch_seqs_.size() * static_cast<size_t>(n_vocab));
  const auto t0 = std::chrono::steady_clock::now();
  model_->Forward(batch_, *kv_, pool_, logits_.data());
  const double ms =
      std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();

  for (const ScheduledChunk& c : chunks_) {
    Sequence& s = *c.seq;
    if (s.timings.scheduled == SequenceTimings::Clock::time_point{}) s.timings.scheduled = t0;
    s.n_cached += c.n_tokens;
    kv_->CacheFullBlocks(s.id, std::span<const int32_t>(s.tokens.data(), s.n_cached));
    if (s.n_generated() == 0) {
      s.timings.prefill_ms += ms;
      s.timings.prefill_tokens += c.n_tokens;
    } else {
      s.timings.decode_ms += ms;
    }
  }
  for (size_t r = 0; r < batch_seqs_.size(); ++r) {
    Sequence& s = *batch_seqs_[r];
    const float* row = &logits_[r * n_vocab];
    if (s.n_generated() > 0) ++s.timings.decode_steps;
    SampleNext(s, row, events);
    if (!s.pending_forks.empty()) ForkPending(s, row, events);
  }
}

void Engine::SampleNext(Sequence& s, const float* logits, std::vector<TokenEvent>* events) {
  const int32_t n_vocab = model_->config().n_vocab;
  const int32_t token = s.sampler.Sample(logits, n_vocab, s.tokens);
  s.tokens.push_back(token);
  if (s.n_generated() == 1) s.timings.first_token = SequenceTimings::Clock::now();
  const auto& stop = s.params.stop_tokens;
  if (std::find(stop.begin(), stop.end(), token) != stop.end()) {
    s.finish = FinishReason::kStop;
  } else if (s.params.max_tokens >= 0 && s.n_generated() >= s.params.max_tokens) {
    s.finish = FinishReason::kLength;
  } else if (static_cast<int64_t>(s.tokens.size()) > ContextLimit()) {
    s.finish = FinishReason::kContext;
  }
  events->push_back(TokenEvent{s.id, token, s.finish});
  if (s.finished()) scheduler_.Remove(&s);
  kv_->ReleaseOutsideWindow(s.id, s.n_cached);
}

void Engine::ForkPending(Sequence& leader, const float* logits, std::vector<TokenEvent>* events) {
  for (Sequence* sib : leader.pending_forks) {
    kv_->Fork(leader.id, sib->id);
    sib->fork_of = nullptr;
    sib->n_cached = leader.n_cached;
    sib->prefix = leader.prefix;
    sib->prefix_looked_up = true;
    sib->timings.prefill_ms = leader.timings.prefill_ms;
    sib->timings.prefill_tokens = leader.timings.prefill_tokens;
    scheduler_.AddRunning(sib);
    SampleNext(*sib, logits, events);
  }
  leader.pending_forks.clear();
}

void Engine::Finish(SeqId seq, FinishReason reason) {
  Sequence* s = Find(seq);
  if (s == nullptr || s->finished()) return;
  s->finish = reason;
  scheduler_.Remove(s);
  if (s->fork_of != nullptr) {
    std::erase(s->fork_of->pending_forks, s);
    s->fork_of = nullptr;
  }
  DetachForks(*s);
}

void Engine::DetachForks(Sequence& s) {
  // Completions that waited for this prompt now prefill it themselves (mostly prefix hits).
  for (Sequence* p : s.pending_forks) {
    p->fork_of = nullptr;
    scheduler_.AddWaiting(p);
  }
  s.pending_forks.clear();
}

Sequence* Engine::Find(SeqId seq) {
  for (const auto& s : seqs_) {
    if (s->id == seq) return s.get();
  }
  return nullptr;
}

const Sequence& Engine::Get(SeqId seq) const {
  Sequence* s = const_cast<Engine*>(this)->Find(seq);
  KVLLM_CHECK(s != nullptr);
  return *s;
}

Status Engine::Continue(SeqId seq, const std::vector<int32_t>& tokens, int32_t max_tokens,
                        bool keep_cache) {
  Sequence* s = Find(seq);
  if (s == nullptr || !s->finished()) return Status::Error("no finished sequence to continue");
  std::vector<int32_t> all = s->tokens;
  if (s->finish == FinishReason::kStop) all.pop_back();
  all.insert(all.end(), tokens.begin(), tokens.end());
  KVLLM_RETURN_IF_ERROR(ValidateTokens(all));
  s->tokens = std::move(all);
  if (!keep_cache) {
    kv_->Free(s->id);
    s->n_cached = 0;
  }
  s->reuse_prefix = keep_cache;
  s->prefix_looked_up = false;
  s->prefix = PrefixMatch{};
  s->n_prompt = static_cast<int32_t>(s->tokens.size());
  s->params.max_tokens = max_tokens;
  s->finish = FinishReason::kNone;
  s->timings = SequenceTimings{};
  s->timings.arrival = SequenceTimings::Clock::now();
  scheduler_.AddWaiting(s);
  return Status::Ok();
}

Status Engine::Evaluate(const std::vector<int32_t>& tokens, int32_t first_row,
                        std::vector<float>* logits) {
  const auto n = static_cast<int32_t>(tokens.size());
  if (n == 0 || first_row < 0 || first_row >= n) return Status::Error("nothing to evaluate");
  KVLLM_RETURN_IF_ERROR(ValidateTokens(tokens));
  SeqId id(next_seq_++);
  if (!kv_->CanAppend(id, n)) {
    return Status::Error("the KV cache has no room for " + std::to_string(n) + " tokens now");
  }
  kv_->Append(id, n);
  batch_.Clear();
  for (int32_t i = 0; i < n; ++i) batch_.Add(tokens[i], i, id, i >= first_row);
  logits->resize(static_cast<size_t>(n - first_row) * model_->config().n_vocab);
  model_->Forward(batch_, *kv_, pool_, logits->data());
  kv_->Free(id);
  return Status::Ok();
}

void Engine::Release(SeqId seq) {
  Finish(seq, FinishReason::kAbort);
  if (Sequence* s = Find(seq)) DetachForks(*s);
  kv_->Free(seq);
  std::erase_if(seqs_, [seq](const auto& s) { return s->id == seq; });
}

}  // namespace kvllm
