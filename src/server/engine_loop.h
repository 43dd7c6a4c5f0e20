// EngineLoop: the one thread that owns the Engine in a server. HTTP threads submit requests
// and cancellations into its inbox and read each request's output from a RequestStream; the
// loop drains the inbox between steps, runs Engine::Step, turns tokens into text (UTF-8 held
// back until complete, stop strings matched across token boundaries and never sent), and
// records the metrics. A request with n > 1 completions is one stream of n choices.
//
//   HTTP thread ──Submit──▶ inbox ──▶ loop thread: Engine::Add / Step / Finish / Release
//        ▲                                              │
//        └──── RequestStream (deltas, usage) ◀──────────┘
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include <nlohmann/json.hpp>

#include "engine/engine.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"

namespace kvllm::server {

struct SubmitParams {
  std::string request_id;  // for /kv
  Request request;         // prompt, sampling, max tokens, stop tokens, n
  std::vector<std::string> stop;  // stop strings
};

struct Usage {
  int32_t prompt_tokens = 0;
  int32_t completion_tokens = 0;
  int32_t cached_tokens = 0;  // prompt tokens reused from the prefix cache
};

struct ChoiceDelta {
  int32_t index = 0;
  std::string text;
  std::string finish_reason;  // empty while the choice goes on: "stop", "length", "abort"
};

class RequestStream {
 public:
  enum class State { kPending, kRunning, kRejected, kDone };
  // Waits up to `timeout` for news, moves the deltas so far into `out` and returns the state.
  State Wait(std::chrono::milliseconds timeout, std::vector<ChoiceDelta>* out);
  const ApiError& error() const { return error_; }  // once kRejected
  Usage usage() const;                                // once kDone

 private:
  friend class EngineLoop;
  void Accept();
  void Reject(ApiError e);
  void Push(ChoiceDelta d);
  void Done(Usage u);

  mutable std::mutex mu_;
  std::condition_variable cv_;
  State state_ = State::kPending;
  std::vector<ChoiceDelta> deltas_;
  ApiError error_;
  Usage usage_;
};

struct LoopOptions {
  int32_t max_waiting = 256;  // queued sequences beyond which new requests get 503
  size_t recent_requests = 32;  // kept for /kv
};

class EngineLoop {
 public:
  EngineLoop(Engine* engine, const Tokenizer* tokenizer, Metrics* metrics, LoopOptions options);
  ~EngineLoop();
  EngineLoop(const EngineLoop&) = delete;
  EngineLoop& operator=(const EngineLoop&) = delete;

  // Queues a request; the stream says whether the engine took it (kRunning) or why not.
  std::shared_ptr<RequestStream> Submit(SubmitParams params);
  // Cancels a request (a client went away): its sequences end and their blocks are freed.
  void Cancel(const std::shared_ptr<RequestStream>& stream);
  GaugeSnapshot Gauges();
  // GET /kv: pool, per-request block tables, prefix-cache hit rate and recent misses.
  nlohmann::json KvJson();
  // Ends the loop; unfinished requests end with "abort".
  void Stop();

 private:
  struct Choice {
    SeqId seq;
    Utf8Streamer utf8;
    std::string text;
    size_t sent = 0;
    int32_t generated = 0;
    bool done = false;
    std::chrono::steady_clock::time_point last_token;
  };
  struct Active {
    SubmitParams params;
    std::shared_ptr<RequestStream> stream;
    std::vector<Choice> choices;
    std::chrono::steady_clock::time_point arrival;
    bool first_token = false;
    int32_t cached_tokens = 0;
  };
  struct Recent {
    std::string request_id;
    int32_t prompt_tokens;
    int32_t prefilled_tokens;  // prompt tokens computed (the rest came from the cache)
    PrefixMatch prefix;
  };

  void Run();
  // Runs `fn` on the loop thread between steps and waits for it.
  void RunOnLoop(std::function<void()> fn);
  void StartRequest(SubmitParams params, std::shared_ptr<RequestStream> stream);
  void OnToken(Active& a, int32_t index, const TokenEvent& ev);
  void FinishChoice(Active& a, int32_t index, const std::string& reason);
  void CancelRequest(const std::shared_ptr<RequestStream>& stream);
  void CompleteIfDone(std::list<Active>::iterator it);

  Engine* engine_;
  const Tokenizer* tokenizer_;
  Metrics* metrics_;
  LoopOptions options_;

  std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> inbox_;
  bool stopping_ = false;
  std::thread thread_;

  // Loop thread only.
  std::list<Active> active_;
  std::unordered_map<int32_t, std::pair<Active*, int32_t>> by_seq_;  // seq → request, choice
  std::deque<Recent> recent_;
};

}  // namespace kvllm::server
