#include "tokenizer/chat_template.h"

#include <gtest/gtest.h>

namespace kvllm {
namespace {

const std::vector<ChatMessage> kConversation = {
    {"system", "Be brief."}, {"user", "Hi"}, {"assistant", "Hello!"}, {"user", "Who are you?"}};

TEST(ChatTemplateTest, DetectsTemplatesByTheirMarkers) {
  EXPECT_EQ(ChatTemplate::Detect("{% for m in messages %}<|im_start|>{{ m.role }}").kind(),
            ChatTemplateKind::kChatML);
  EXPECT_EQ(ChatTemplate::Detect("<|start_header_id|>' + message['role'] + '<|end_header_id|>")
                .kind(),
            ChatTemplateKind::kLlama3);
  EXPECT_EQ(ChatTemplate::Detect("[INST] <<SYS>>\\n' + system + '\\n<</SYS>>").kind(),
            ChatTemplateKind::kLlama2);
  EXPECT_EQ(ChatTemplate::Detect("{{ '[INST] ' + message['content'] + '[/INST]' }}").kind(),
            ChatTemplateKind::kMistral);
  EXPECT_EQ(ChatTemplate::Detect("<|user|>\\n' + message['content'] + eos_token").kind(),
            ChatTemplateKind::kZephyr);
  EXPECT_EQ(ChatTemplate::Detect("<|user|>' + message['content'] + '<|end|>\\n<|assistant|>")
                .kind(),
            ChatTemplateKind::kPhi3);
  EXPECT_EQ(ChatTemplate::Detect("<start_of_turn>user\\n").kind(), ChatTemplateKind::kGemma);
  EXPECT_EQ(ChatTemplate::Detect("").kind(), ChatTemplateKind::kChatML);
}

TEST(ChatTemplateTest, NamesRoundTrip) {
  for (const std::string& name : ChatTemplate::Names()) {
    auto t = ChatTemplate::FromName(name);
    ASSERT_TRUE(t.has_value()) << name;
    EXPECT_EQ(t->name(), name);
  }
  EXPECT_FALSE(ChatTemplate::FromName("jinja").has_value());
}

TEST(ChatTemplateTest, ChatML) {
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::kChatML).Apply(kConversation, true),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
            "<|im_start|>assistant\nHello!<|im_end|>\n<|im_start|>user\nWho are you?<|im_end|>\n"
            "<|im_start|>assistant\n");
}

TEST(ChatTemplateTest, Llama2FoldsSystemIntoFirstTurn) {
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::kLlama2).Apply(kConversation, true),
            "[INST] <<SYS>>\nBe brief.\n<</SYS>>\n\nHi [/INST]Hello!</s><s>[INST] Who are you? "
            "[/INST]");
}

TEST(ChatTemplateTest, Llama3) {
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::kLlama3).Apply({{"user", "Hi"}}, true),
            "<|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>"
            "<|start_header_id|>assistant<|end_header_id|>\n\n");
}

TEST(ChatTemplateTest, GemmaHasNoSystemRole) {
  EXPECT_EQ(ChatTemplate(ChatTemplateKind::kGemma).Apply({{"system", "S"}, {"user", "U"}}, true),
            "<start_of_turn>user\nS\n\nU<end_of_turn>\n<start_of_turn>model\n");
}

// Multi-turn KV reuse relies on this: a conversation's text extends the text of its past.
TEST(ChatTemplateTest, EveryTemplateRendersAPrefixOfItsContinuation) {
  for (const std::string& name : ChatTemplate::Names()) {
    const ChatTemplate t = *ChatTemplate::FromName(name);
    std::vector<ChatMessage> past(kConversation.begin(), kConversation.begin() + 2);
    const std::string before = t.Apply(past, true) + "Hello!";
    const std::string after = t.Apply(kConversation, true);
    EXPECT_EQ(after.rfind(before, 0), 0u) << name << "\n" << before << "\n---\n" << after;
  }
}

}  // namespace
}  // namespace kvllm
