// Request and Sequence: what a caller asks the Engine for, and the Engine's record of it.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "kv/ids.h"
#include "kv/kv_cache.h"

namespace kvllm {

struct GenerationParams {
  SamplingParams sampling;
  int32_t max_tokens = 128;          // generated tokens at most; < 0: until the cache is full
  std::vector<int32_t> stop_tokens;  // end of generation (usually the vocabulary's EOS)
};

struct Request {
  std::vector<int32_t> prompt;  // token ids, not empty
  GenerationParams params;
  // Completions of the prompt: n sequences with consecutive ids that share the prompt's
  // blocks once it is prefilled; a fixed seed s gives completion i the seed s + i.
  int32_t n = 1;
};

enum class FinishReason {
  kNone,     // still running
  kLength,   // max_tokens reached
  kStop,     // a stop token was generated, or the caller saw a stop string
  kContext,  // the KV cache or the context size is full
  kAbort,    // the caller cancelled it
};
const char* FinishReasonName(FinishReason r);  // "length", "stop", "context", "abort"

// Per-sequence timings. Prefill is the steps that computed the prompt, the last of which
// produced the first token; decode is every later step.
struct SequenceTimings {
  using Clock = std::chrono::steady_clock;
  double prefill_ms = 0;
  double decode_ms = 0;
  int32_t prefill_tokens = 0;  // prompt tokens computed (not reused from the cache)
  int32_t decode_steps = 0;
  Clock::time_point arrival;      // Add() or Continue()
  Clock::time_point scheduled;    // the first step that computed any of it
  Clock::time_point first_token;  // when the first token was sampled
};

struct Sequence {
  SeqId id;
  std::vector<int32_t> tokens;  // prompt followed by generated tokens
  int32_t n_prompt = 0;
  int32_t n_cached = 0;         // tokens whose K/V are in the cache
  GenerationParams params;
  Sampler sampler;
  FinishReason finish = FinishReason::kNone;
  SequenceTimings timings;

  // Prefix cache: the first lookup for this prompt (tokens reused and why it stopped), and
  // whether the next admission may look at all (off for a turn that asked for no reuse).
  PrefixMatch prefix;
  bool prefix_looked_up = false;
  bool reuse_prefix = true;
  int32_t preemptions = 0;
  // n > 1: the completions waiting for this one's prompt to be prefilled, which then fork it.
  std::vector<Sequence*> pending_forks;
  Sequence* fork_of = nullptr;  // set while this one waits in another's pending_forks

  Sequence(SeqId seq_id, Request req)
      : id(seq_id),
        tokens(std::move(req.prompt)),
        n_prompt(static_cast<int32_t>(tokens.size())),
        params(std::move(req.params)),
        sampler(params.sampling) {}
  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  bool finished() const { return finish != FinishReason::kNone; }
  // Tokens reused from the prefix cache for this prompt.
  int32_t cached_tokens() const { return prefix.tokens; }
};

}  // namespace kvllm
