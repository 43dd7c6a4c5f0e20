#include "server/openai_protocol.h"

#include <nlohmann/json.hpp>

namespace kvllm::server {
namespace {

using nlohmann::json;

ApiError Bad(std::string param, std::string message) {
  ApiError e;
  e.param = std::move(param);
  e.message = std::move(message);
  return e;
}

// Reads an optional number field into `out` within [lo, hi].
template <typename T>
std::optional<ApiError> Number(const json& j, const char* key, double lo, double hi, T* out) {
  auto it = j.find(key);
  if (it == j.end() || it->is_null()) return std::nullopt;
  if (!it->is_number()) return Bad(key, std::string("'") + key + "' must be a number");
  const double v = it->get<double>();
  if (!(v >= lo && v <= hi)) {
    return Bad(key, std::string("'") + key + "' must be between " + json(lo).dump() + " and " +
                        json(hi).dump() + ", got " + it->dump());
  }
  if constexpr (std::is_integral_v<T>) {
    if (!it->is_number_integer()) return Bad(key, std::string("'") + key + "' must be an integer");
  }
  *out = static_cast<T>(v);
  return std::nullopt;
}

std::optional<ApiError> ParseMessages(const json& j, CompletionParams* out) {
  auto it = j.find("messages");
  if (it == j.end() || !it->is_array() || it->empty()) {
    return Bad("messages", "'messages' must be a non-empty array");
  }
  for (const json& m : *it) {
    if (!m.is_object()) return Bad("messages", "each message must be an object");
    auto role = m.find("role");
    if (role == m.end() || !role->is_string()) return Bad("messages", "a message has no 'role'");
    std::string r = role->get<std::string>();
    if (r == "developer") r = "system";
    if (r != "system" && r != "user" && r != "assistant") {
      return Bad("messages", "unsupported message role '" + r + "'");
    }
    std::string content;
    auto c = m.find("content");
    if (c == m.end() || c->is_null()) {
      content = "";
    } else if (c->is_string()) {
      content = c->get<std::string>();
    } else if (c->is_array()) {
      // Content parts: only text is understood.
      for (const json& part : *c) {
        // Each member's type is checked before it is read: json::value() and get() throw on
        // a mismatch ({"type": 5}), which would answer a bad request with a 500.
        // (find() gives end() for a part that is not an object.)
        const auto type = part.find("type");
        const auto text = part.find("text");
        if (type == part.end() || *type != "text" || text == part.end() || !text->is_string()) {
          return Bad("messages", "only text content parts are supported");
        }
        content += text->get_ref<const std::string&>();
      }
    } else {
      return Bad("messages", "a message's 'content' must be a string or an array of parts");
    }
    out->messages.push_back(ChatMessage{std::move(r), std::move(content)});
  }
  return std::nullopt;
}

std::optional<ApiError> ParsePrompt(const json& j, CompletionParams* out) {
  auto it = j.find("prompt");
  if (it == j.end()) return Bad("prompt", "'prompt' is required");
  if (it->is_string()) {
    out->prompt = it->get<std::string>();
  } else if (it->is_array() && !it->empty() && (*it)[0].is_string()) {
    if (it->size() != 1) return Bad("prompt", "only one prompt per request is supported");
    out->prompt = (*it)[0].get<std::string>();
  } else if (it->is_array() && !it->empty() && (*it)[0].is_number_integer()) {
    for (const json& t : *it) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() > INT32_MAX) {
        return Bad("prompt", "a token-id prompt must hold non-negative integers");
      }
      out->prompt_tokens.push_back(t.get<int32_t>());
    }
  } else {
    return Bad("prompt", "'prompt' must be a string, an array of one string or of token ids");
  }
  if (out->prompt.empty() && out->prompt_tokens.empty()) return Bad("prompt", "the prompt is empty");
  return std::nullopt;
}

}  // namespace

std::optional<ApiError> ParseCompletionRequest(std::string_view body, bool chat,
                                               const RequestLimits& limits,
                                               CompletionParams* out) {
  *out = CompletionParams{};
  out->chat = chat;
  json j = json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("", "the request body is not valid JSON");
  if (!j.is_object()) return Bad("", "the request body must be a JSON object");

  if (auto m = j.find("model"); m != j.end() && !m->is_null()) {
    if (!m->is_string()) return Bad("model", "'model' must be a string");
    out->model = m->get<std::string>();
  }
  if (auto e = chat ? ParseMessages(j, out) : ParsePrompt(j, out)) return e;
  size_t chars = out->prompt.size();
  for (const ChatMessage& m : out->messages) chars += m.content.size();
  if (chars > limits.max_prompt_chars) {
    ApiError e = Bad(chat ? "messages" : "prompt", "the prompt is longer than " +
                                                       std::to_string(limits.max_prompt_chars) +
                                                       " characters");
    e.status = 413;
    return e;
  }
  if (!chat) out->max_tokens = 16;  // OpenAI's default for completions
  const char* max_key = chat && j.contains("max_completion_tokens") ? "max_completion_tokens"
                                                                    : "max_tokens";
  if (auto e = Number(j, max_key, 1, INT32_MAX, &out->max_tokens)) return e;
  if (auto e = Number(j, "temperature", 0, 2, &out->temperature)) return e;
  if (auto e = Number(j, "top_p", 0, 1, &out->top_p)) return e;
  if (out->top_p <= 0) return Bad("top_p", "'top_p' must be greater than 0");
  if (auto e = Number(j, "top_k", -1, INT32_MAX, &out->top_k)) return e;
  if (auto e = Number(j, "min_p", 0, 1, &out->min_p)) return e;
  if (auto e = Number(j, "repetition_penalty", 0.01, 10, &out->repetition_penalty)) return e;
  if (auto e = Number(j, "n", 1, limits.max_n, &out->n)) return e;
  if (auto s = j.find("seed"); s != j.end() && !s->is_null()) {
    if (!s->is_number_integer()) return Bad("seed", "'seed' must be an integer");
    out->seed = static_cast<uint64_t>(s->get<int64_t>());
  }
  if (auto s = j.find("stop"); s != j.end() && !s->is_null()) {
    if (s->is_string()) {
      out->stop.push_back(s->get<std::string>());
    } else if (s->is_array()) {
      for (const json& x : *s) {
        if (!x.is_string()) return Bad("stop", "'stop' must be a string or an array of strings");
        out->stop.push_back(x.get<std::string>());
      }
    } else {
      return Bad("stop", "'stop' must be a string or an array of strings");
    }
    std::erase(out->stop, std::string());
    if (static_cast<int32_t>(out->stop.size()) > limits.max_stop) {
      return Bad("stop", "at most " + std::to_string(limits.max_stop) + " stop strings");
    }
  }
  if (auto s = j.find("stream"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return Bad("stream", "'stream' must be a boolean");
    out->stream = s->get<bool>();
  }
  if (auto s = j.find("stream_options"); s != j.end() && !s->is_null()) {
    if (!s->is_object()) return Bad("stream_options", "'stream_options' must be an object");
    auto u = s->find("include_usage");
    if (u != s->end() && !u->is_null()) {
      if (!u->is_boolean()) return Bad("stream_options", "'include_usage' must be a boolean");
      out->include_usage = u->get<bool>();
    }
  }
  if (auto s = j.find("ignore_eos"); s != j.end() && !s->is_null()) {
    if (!s->is_boolean()) return Bad("ignore_eos", "'ignore_eos' must be a boolean");
    out->ignore_eos = s->get<bool>();
  }
  return std::nullopt;
}

std::string DumpJson(const nlohmann::json& j) {
  return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
}

std::string ErrorJson(const ApiError& e) {
  json err = {{"message", e.message},
              {"type", e.type},
              {"param", e.param.empty() ? json(nullptr) : json(e.param)},
              {"code", e.code.empty() ? json(nullptr) : json(e.code)}};
  return DumpJson(json{{"error", err}});
}

}  // namespace kvllm::server
