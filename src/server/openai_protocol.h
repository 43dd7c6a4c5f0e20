// The OpenAI request format, as far as kvllm serves it: parsing and checking the JSON body of
// /v1/completions and /v1/chat/completions into CompletionParams, and OpenAI's error JSON.
// Pure functions, no I/O: the server and the fuzz targets call them directly.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "tokenizer/chat_template.h"

namespace kvllm::server {

struct CompletionParams {
  bool chat = false;
  std::string model;
  std::string prompt;                  // /v1/completions, text
  std::vector<int32_t> prompt_tokens;  // /v1/completions, token ids given directly
  std::vector<ChatMessage> messages;   // /v1/chat/completions
  int32_t max_tokens = -1;             // -1: until a stop or the context is full
  float temperature = 1.0f;
  float top_p = 1.0f;
  int32_t top_k = 0;  // 0 or -1: off
  float min_p = 0.0f;
  float repetition_penalty = 1.0f;
  int32_t n = 1;
  std::vector<std::string> stop;
  std::optional<uint64_t> seed;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  bool ignore_eos = false;     // vLLM's extension: generate past the end-of-generation token
};

struct ApiError {
  int status = 400;
  std::string message;
  std::string type = "invalid_request_error";
  std::string param;  // the offending field, if one
  std::string code;
};

// Limits a request must respect.
struct RequestLimits {
  int32_t max_n = 16;
  int32_t max_stop = 16;
  size_t max_prompt_chars = 1 << 20;
};

// Parses a request body. On error returns the ApiError (status 400) naming the field.
std::optional<ApiError> ParseCompletionRequest(std::string_view body, bool chat,
                                               const RequestLimits& limits, CompletionParams* out);

// Compact JSON; invalid UTF-8 (from a request or a model) becomes U+FFFD instead of throwing.
std::string DumpJson(const nlohmann::json& j);

// {"error": {"message", "type", "param", "code"}}
std::string ErrorJson(const ApiError& e);

}  // namespace kvllm::server
