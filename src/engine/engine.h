// Engine: runs requests over one Model and one paged KVCache, one step at a time. Every
// step the Scheduler picks the tokens (one per decoding sequence, then chunks of prompts,
// within --max-num-batched-tokens), the Engine builds one ForwardBatch of them all, runs one
// forward pass (matrix x matrix over every token of the step) and samples one token for each
// sequence whose chunk reached its end. Full blocks enter the prefix cache as they are
// computed; n > 1 completions fork the prompt's blocks once it is prefilled. The CLI, the
// server and the benchmarks drive this same loop.
//
// With `kv_cache = false` (the baseline) every step forgets the sequence's cache and
// recomputes all of its tokens through the same forward pass; outputs are the same tokens.
//
// Not thread-safe: one thread owns the Engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <unordered_map>
#include <string>
#include <vector>

#include "base/status.h"
#include "engine/request.h"
#include "engine/scheduler.h"
#include "kv/kv_cache.h"
#include "kv/kv_format.h"
#include "model/model.h"
#include "tensor/thread_pool.h"

namespace kvllm {

struct EngineOptions {
  int32_t ctx_size = 0;      // token capacity of the KV pool; 0: the model's context length
  int32_t block_size = 16;   // tokens per KV block
  KVFormat k_type = DType::kF16;  // formats of the K and V cache (kv/kv_format.h)
  KVFormat v_type = DType::kF16;
  int32_t n_threads = 0;     // 0: one per CPU
  bool kv_cache = true;      // false: recompute every step (baseline)
  // Sliding window with attention sinks (see KVWindow); 0 uses the model's own sliding window
  // if its GGUF declares one. With a window and the cache, generation is not bounded by
  // ctx_size: memory stays flat.
  int32_t kv_window = 0;
  int32_t kv_sinks = 0;
  bool prefix_caching = true;  // --no-prefix-caching turns it off (the comparison)
  // Persistent tiers under the prefix cache (need it): a directory (LRU-limited to
  // kv_store_dir_bytes, 0 = unlimited) and a Redis URL. A Redis that cannot be reached at
  // start is skipped with a warning; one that goes down later is a miss until it is back.
  std::string kv_store_dir;
  uint64_t kv_store_dir_bytes = 0;
  std::string kv_store_redis;
  SchedulerOptions scheduler;
};

struct TokenEvent {
  SeqId seq;
  int32_t token;
  FinishReason finish;  // kNone while the sequence goes on
};

class Engine {
 public:
  static StatusOr<std::unique_ptr<Engine>> Create(Model* model, const EngineOptions& options);

  // Queues a request and returns the id of its first sequence; with n > 1 the others follow
  // with consecutive ids. Errors (nothing queued): empty prompt, token ids outside the
  // vocabulary, a prompt that cannot fit the KV pool or the context size, n < 1.
  StatusOr<SeqId> Add(Request request);
  bool HasUnfinished() const;
  // Runs one step; appends one event per sequence that produced a token. A sequence whose
  // cache cannot grow finishes (kContext) without a token: check Get(seq).finished().
  void Step(std::vector<TokenEvent>* events);
  const Sequence& Get(SeqId seq) const;
  bool Has(SeqId seq) const { return const_cast<Engine*>(this)->Find(seq) != nullptr; }
  // Ends an unfinished sequence now (a cancelled request, a stop string the caller matched);
  // it stays readable until Release.
  void Finish(SeqId seq, FinishReason reason);
  // Gives a finished sequence more tokens and runs it again: the next turn of a chat. With
  // `keep_cache` its K/V stays and only the new tokens are prefilled; without, the whole
  // sequence is prefilled again (the comparison baseline). A stop token that ended the last
  // turn is dropped (it is not text); a token sampled at the length limit is kept and fed.
  // Timings restart and n_prompt becomes the sequence's new length.
  Status Continue(SeqId seq, const std::vector<int32_t>& tokens, int32_t max_tokens,
                  bool keep_cache);
  // Scores `tokens` as one prefill of a temporary sequence and returns the logits of the
  // rows [first_row, size): logits [size - first_row][n_vocab]. The cache is left as found.
  Status Evaluate(const std::vector<int32_t>& tokens, int32_t first_row, std::vector<float>* logits);
  // Forgets a finished sequence and returns its blocks to the pool.
  void Release(SeqId seq);

  const KVCache& kv() const { return *kv_; }
  KVCache& mutable_kv() { return *kv_; }
  StoreTiers* store() const { return store_.get(); }
  const Scheduler& scheduler() const { return scheduler_; }
  const EngineOptions& options() const { return options_; }
  const Model& model() const { return *model_; }

 private:
  Engine(Model* model, const EngineOptions& options, std::unique_ptr<StoreTiers> store,
         std::unique_ptr<KVCache> kv);
  Sequence* Find(SeqId seq);
  Status ValidateTokens(const std::vector<int32_t>& tokens) const;
  // Samples the next token of `s` from its logits row and applies the stop rules.
  void SampleNext(Sequence& s, const float* logits, std::vector<TokenEvent>* events);
  // Gives each completion waiting on `leader` its own copy of the prompt's cache.
  void ForkPending(Sequence& leader, const float* logits, std::vector<TokenEvent>* events);
  int64_t ContextLimit() const;
  // Sends the completions waiting on `s` to the queue on their own.
  void DetachForks(Sequence& s);

  Model* model_;
  EngineOptions options_;
  std::unique_ptr<StoreTiers> store_;  // outlives kv_, which points to it
  std::unique_ptr<KVCache> kv_;
  Scheduler scheduler_;
  ThreadPool pool_;
  int32_t next_seq_ = 0;
  std::vector<std::unique_ptr<Sequence>> seqs_;  // in arrival order
  ForwardBatch batch_;
  std::vector<ScheduledChunk> chunks_;  // this step's plan
  std::vector<Sequence*> batch_seqs_;  // sequence of each logits row
  std::vector<float> logits_;          // [rows][n_vocab]
};

}  // namespace kvllm
