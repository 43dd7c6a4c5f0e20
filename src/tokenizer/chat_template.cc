#include "tokenizer/chat_template.h"

#include <array>

namespace kvllm {
namespace {

struct NamedKind {
  const char* name;
  ChatTemplateKind kind;
};
constexpr std::array<NamedKind, 7> kKinds = {{
    {"chatml", ChatTemplateKind::kChatML},
    {"llama2", ChatTemplateKind::kLlama2},
    {"llama3", ChatTemplateKind::kLlama3},
    {"mistral", ChatTemplateKind::kMistral},
    {"zephyr", ChatTemplateKind::kZephyr},
    {"phi3", ChatTemplateKind::kPhi3},
    {"gemma", ChatTemplateKind::kGemma},
}};

bool Has(std::string_view text, std::string_view marker) {
  return text.find(marker) != std::string_view::npos;
}

// Llama 2 and Mistral wrap each user turn in [INST] ... [/INST]; Llama 2 folds the system
// prompt into the first user turn inside <<SYS>> markers, Mistral prepends it to that turn.
// The assistant's text follows [/INST] verbatim: SentencePiece models generate their own
// leading space, and a rendered history must be a prefix of its continuation (chat KV reuse).
std::string ApplyInst(const std::vector<ChatMessage>& messages, bool llama2) {
  std::string out, system;
  bool first_user = true;
  for (const ChatMessage& m : messages) {
    if (m.role == "system") {
      system = m.content;
    } else if (m.role == "user") {
      std::string content = m.content;
      if (first_user && !system.empty()) {
        content = llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content
                         : system + "\n\n" + content;
      }
      if (!first_user) out += llama2 ? "<s>" : "";
      out += llama2 ? "[INST] " + content + " [/INST]" : "[INST] " + content + "[/INST]";
      first_user = false;
    } else {
      out += m.content + "</s>";
    }
  }
  return out;
}

}  // namespace

ChatTemplate ChatTemplate::Detect(std::string_view t) {
  if (Has(t, "<|im_start|>")) return ChatTemplate(ChatTemplateKind::kChatML);
  if (Has(t, "<|start_header_id|>")) return ChatTemplate(ChatTemplateKind::kLlama3);
  if (Has(t, "<start_of_turn>")) return ChatTemplate(ChatTemplateKind::kGemma);
  if (Has(t, "<|assistant|>") && Has(t, "<|end|>")) return ChatTemplate(ChatTemplateKind::kPhi3);
  if (Has(t, "<|user|>")) return ChatTemplate(ChatTemplateKind::kZephyr);
  if (Has(t, "[INST]")) {
    return ChatTemplate(Has(t, "<<SYS>>") ? ChatTemplateKind::kLlama2 : ChatTemplateKind::kMistral);
  }
  return ChatTemplate(ChatTemplateKind::kChatML);
}

std::optional<ChatTemplate> ChatTemplate::FromName(std::string_view name) {
  for (const NamedKind& k : kKinds) {
    if (name == k.name) return ChatTemplate(k.kind);
  }
  return std::nullopt;
}

std::vector<std::string> ChatTemplate::Names() {
  std::vector<std::string> names;
  for (const NamedKind& k : kKinds) names.push_back(k.name);
  return names;
}

const char* ChatTemplate::name() const {
  for (const NamedKind& k : kKinds) {
    if (k.kind == kind_) return k.name;
  }
  return "?";
}

std::string ChatTemplate::Apply(const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) const {
  std::string out;
  switch (kind_) {
    case ChatTemplateKind::kChatML:
      for (const ChatMessage& m : messages) {
        out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      }
      if (add_generation_prompt) out += "<|im_start|>assistant\n";
      return out;
    case ChatTemplateKind::kLlama3:
      for (const ChatMessage& m : messages) {
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + m.content + "<|eot_id|>";
      }
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      return out;
    case ChatTemplateKind::kLlama2:
    case ChatTemplateKind::kMistral:
      return ApplyInst(messages, kind_ == ChatTemplateKind::kLlama2);
    case ChatTemplateKind::kZephyr:
      for (const ChatMessage& m : messages) {
        out += "<|" + m.role + "|>\n" + m.content + "</s>\n";
      }
      if (add_generation_prompt) out += "<|assistant|>\n";
      return out;
    case ChatTemplateKind::kPhi3:
      for (const ChatMessage& m : messages) {
        out += "<|" + m.role + "|>\n" + m.content + "<|end|>\n";
      }
      if (add_generation_prompt) out += "<|assistant|>\n";
      return out;
    case ChatTemplateKind::kGemma: {
      // Gemma has no system role: the system prompt opens the first user turn.
      std::string system;
      for (const ChatMessage& m : messages) {
        if (m.role == "system") {
          system = m.content + "\n\n";
          continue;
        }
        const std::string role = m.role == "assistant" ? "model" : m.role;
        out += "<start_of_turn>" + role + "\n" + system + m.content + "<end_of_turn>\n";
        system.clear();
      }
      if (add_generation_prompt) out += "<start_of_turn>model\n";
      return out;
    }
  }
  return out;
}

}  // namespace kvllm
