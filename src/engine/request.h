// Request and Sequence: what a caller asks the Engine for, and the Engine's record of it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "engine/sampler.h"
#include "kv/ids.h"

namespace kvllm {

struct GenerationParams {
  SamplingParams sampling;
  int32_t max_tokens = 128;          // generated tokens at most; < 0: until the cache is full
  std::vector<int32_t> stop_tokens;  // end of generation (usually the vocabulary's EOS)
};

struct Request {
  std::vector<int32_t> prompt;  // token ids, not empty
  GenerationParams params;
};

enum class FinishReason {
  kNone,     // still running
  kLength,   // max_tokens reached
  kStop,     // a stop token was generated
  kContext,  // the KV cache or the context size is full
};
const char* FinishReasonName(FinishReason r);  // "length", "stop", "context"

// Per-sequence timings. Prefill is the step that computed the prompt and produced the first
// token (time to first token); decode is every later step.
struct SequenceTimings {
  double prefill_ms = 0;
  double decode_ms = 0;
  int32_t prefill_tokens = 0;  // tokens computed by the prefill step
  int32_t decode_steps = 0;
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

  Sequence(SeqId seq_id, Request req)
      : id(seq_id),
        tokens(std::move(req.prompt)),
        n_prompt(static_cast<int32_t>(tokens.size())),
        params(std::move(req.params)),
        sampler(params.sampling) {}
  int32_t n_generated() const { return static_cast<int32_t>(tokens.size()) - n_prompt; }
  bool finished() const { return finish != FinishReason::kNone; }
};

}  // namespace kvllm
