// Fuzzes the OpenAI request parser (ParseCompletionRequest) for /v1/completions and
// /v1/chat/completions, and DumpJson / ErrorJson on what it returns. The first byte picks
// the endpoint and the limits; the rest is the body. A request is either accepted with fields
// inside their documented ranges or refused with a 400/413 ApiError; nothing throws, and every
// JSON kvllm writes parses back.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "server/openai_protocol.h"

namespace kvllm::fuzz {
namespace {

using nlohmann::json;

// DumpJson's output is valid UTF-8 JSON that parses back, to `j` itself when `compare`.
void CheckDump(const json& j, bool compare) {
  const std::string text = server::DumpJson(j);
  FUZZ_CHECK(IsValidUtf8(text), "DumpJson wrote invalid UTF-8");
  const json back = json::parse(text, nullptr, /*allow_exceptions=*/false);
  FUZZ_CHECK(!back.is_discarded(), "DumpJson wrote JSON that does not parse: " + text);
  if (compare) FUZZ_CHECK(back == j, "DumpJson changed the value: " + text);
}

void CheckAccepted(const server::CompletionParams& p, bool chat,
                   const server::RequestLimits& limits) {
  FUZZ_CHECK(p.chat == chat, "chat flag");
  size_t chars = p.prompt.size();
  if (chat) {
    FUZZ_CHECK(!p.messages.empty(), "chat request without messages");
    for (const ChatMessage& m : p.messages) {
      FUZZ_CHECK(m.role == "system" || m.role == "user" || m.role == "assistant", m.role);
      chars += m.content.size();
    }
    FUZZ_CHECK(p.max_tokens == -1 || p.max_tokens >= 1, std::to_string(p.max_tokens));
  } else {
    FUZZ_CHECK(!p.prompt.empty() || !p.prompt_tokens.empty(), "empty prompt accepted");
    for (int32_t t : p.prompt_tokens) FUZZ_CHECK(t >= 0, std::to_string(t));
    FUZZ_CHECK(p.max_tokens >= 1, std::to_string(p.max_tokens));
  }
  FUZZ_CHECK(chars <= limits.max_prompt_chars, "prompt over the limit accepted");
  FUZZ_CHECK(p.n >= 1 && p.n <= limits.max_n, std::to_string(p.n));
  FUZZ_CHECK(static_cast<int32_t>(p.stop.size()) <= limits.max_stop, "too many stops");
  for (const std::string& s : p.stop) FUZZ_CHECK(!s.empty(), "empty stop string");
  FUZZ_CHECK(p.temperature >= 0 && p.temperature <= 2, std::to_string(p.temperature));
  FUZZ_CHECK(p.top_p > 0 && p.top_p <= 1, std::to_string(p.top_p));
  FUZZ_CHECK(p.top_k >= -1, std::to_string(p.top_k));
  FUZZ_CHECK(p.min_p >= 0 && p.min_p <= 1, std::to_string(p.min_p));
  FUZZ_CHECK(p.repetition_penalty >= 0.01f && p.repetition_penalty <= 10,
             std::to_string(p.repetition_penalty));

  // What a response echoes of the request.
  json echo = {{"model", p.model}, {"prompt", p.prompt}, {"stop", p.stop}};
  for (const ChatMessage& m : p.messages) {
    echo["messages"].push_back({{"role", m.role}, {"content", m.content}});
  }
  CheckDump(echo, /*compare=*/true);
}

}  // namespace
}  // namespace kvllm::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvllm;
  using namespace kvllm::fuzz;
  if (size == 0) return 0;
  const bool chat = (data[0] & 1) != 0;
  server::RequestLimits limits;
  if (data[0] & 2) {  // tight limits, so that inputs reach them
    limits.max_n = 2;
    limits.max_stop = 2;
    limits.max_prompt_chars = 16;
  }
  const std::string_view body(reinterpret_cast<const char*>(data + 1), size - 1);

  server::CompletionParams params;
  const std::optional<server::ApiError> error =
      server::ParseCompletionRequest(body, chat, limits, &params);
  if (error) {
    FUZZ_CHECK(error->status == 400 || error->status == 413, std::to_string(error->status));
    FUZZ_CHECK(!error->message.empty(), "an error without a message");
    const json back = json::parse(server::ErrorJson(*error), nullptr, false);
    FUZZ_CHECK(!back.is_discarded() && back.contains("error"), "ErrorJson does not parse");
  } else {
    CheckAccepted(params, chat, limits);
  }

  // The body as JSON, and the raw bytes as a string (model output may be invalid UTF-8).
  const json parsed = json::parse(body, nullptr, /*allow_exceptions=*/false);
  // Not compared: a number too large for a double parses as infinity and is written as null.
  if (!parsed.is_discarded()) CheckDump(parsed, /*compare=*/false);
  CheckDump(json{{"text", std::string(body)}}, /*compare=*/IsValidUtf8(body));
  return 0;
}
