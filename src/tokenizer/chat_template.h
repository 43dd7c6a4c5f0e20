// ChatTemplate: renders a conversation into the prompt text a chat model was trained on.
// Templates are recognised from the text of `tokenizer.chat_template` by distinctive markers,
// as llama.cpp does (no Jinja interpreter); `--chat-template NAME` overrides the choice and
// ChatML is the fallback.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace kvllm {

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

enum class ChatTemplateKind { kChatML, kLlama2, kLlama3, kMistral, kZephyr, kPhi3, kGemma };

class ChatTemplate {
 public:
  explicit ChatTemplate(ChatTemplateKind kind) : kind_(kind) {}
  // Recognises a template from its Jinja text; ChatML when nothing matches or it is empty.
  static ChatTemplate Detect(std::string_view jinja);
  // By name: chatml, llama2, llama3, mistral, zephyr, phi3, gemma.
  static std::optional<ChatTemplate> FromName(std::string_view name);
  static std::vector<std::string> Names();

  ChatTemplateKind kind() const { return kind_; }
  const char* name() const;

  // The conversation as prompt text. The BOS token is not included (the tokenizer adds it).
  // With `add_generation_prompt` the text ends where the assistant's reply begins. Every
  // template inserts message text verbatim, so Apply(history + [reply, next], true) starts
  // with Apply(history, true) + reply: a conversation's KV can be reused turn after turn.
  std::string Apply(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;

 private:
  ChatTemplateKind kind_;
};

}  // namespace kvllm
