// Server: kvllm's OpenAI-compatible HTTP API over an EngineLoop.
//
//   POST /v1/completions, POST /v1/chat/completions   (stream false/true, SSE "data: [DONE]")
//   GET  /v1/models, /health, /metrics (Prometheus), /kv (the KV cache as JSON)
//
// With an API key, /v1/* needs "Authorization: Bearer KEY" (compared in constant time).
// Errors use OpenAI's error JSON. A streaming client that goes away cancels its request.
#pragma once

#include <atomic>
#include <cstdint>
#include <memory>
#include <string>

#include "base/status.h"
#include "server/engine_loop.h"
#include "server/metrics.h"
#include "server/openai_protocol.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace httplib {
class Server;
}

namespace kvllm::server {

struct ServerOptions {
  std::string host = "127.0.0.1";
  int port = 8080;  // 0: any free port
  std::string api_key;  // empty: no authentication
  std::string model_name;
  int32_t http_threads = 0;  // 0: enough for max_num_seqs streams
  size_t max_body_bytes = 8 << 20;
  RequestLimits limits;
};

class Server {
 public:
  Server(ServerOptions options, EngineLoop* loop, Metrics* metrics, const Tokenizer* tokenizer,
         ChatTemplate chat_template, int32_t max_num_seqs);
  ~Server();

  // Binds the address; the port it got is port().
  Status Bind();
  int port() const { return port_; }
  // Serves until Stop() (from any thread); returns at once if Stop() came first.
  void Serve();
  // Ends Serve(), whether its listen loop runs already or is about to start: call it only once
  // Serve() has been or will be called (it waits for the loop to start or Serve() to return).
  void Stop();

 private:
  void Routes();
  bool Authorized(const std::string& header) const;
  void HandleGenerate(const std::string& body, bool chat, void* response);

  ServerOptions options_;
  EngineLoop* loop_;
  Metrics* metrics_;
  const Tokenizer* tokenizer_;
  ChatTemplate template_;
  std::unique_ptr<httplib::Server> http_;
  int port_ = 0;
  int listen_fd_ = -1;
  std::atomic<int64_t> next_id_{0};
  std::atomic<bool> stop_requested_{false};
  std::atomic<bool> served_{false};
};

}  // namespace kvllm::server
