#include "server/openai_protocol.h"

#include <gtest/gtest.h>

namespace kvllm::server {
namespace {

std::optional<ApiError> Parse(const std::string& body, bool chat, CompletionParams* p) {
  return ParseCompletionRequest(body, chat, RequestLimits{}, p);
}

TEST(OpenAiProtocolTest, CompletionWithEveryField) {
  CompletionParams p;
  auto e = Parse(R"({"model":"m","prompt":"Hi","max_tokens":5,"temperature":0.5,"top_p":0.9,
      "top_k":7,"min_p":0.1,"n":2,"stop":["\n","END"],"seed":42,"stream":true,
      "stream_options":{"include_usage":true},"unknown_field":1})", false, &p);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(p.model, "m");
  EXPECT_EQ(p.prompt, "Hi");
  EXPECT_EQ(p.max_tokens, 5);
  EXPECT_FLOAT_EQ(p.temperature, 0.5f);
  EXPECT_FLOAT_EQ(p.top_p, 0.9f);
  EXPECT_EQ(p.top_k, 7);
  EXPECT_FLOAT_EQ(p.min_p, 0.1f);
  EXPECT_EQ(p.n, 2);
  EXPECT_EQ(p.stop, (std::vector<std::string>{"\n", "END"}));
  EXPECT_EQ(p.seed, 42u);
  EXPECT_TRUE(p.stream);
  EXPECT_TRUE(p.include_usage);
}

TEST(OpenAiProtocolTest, DefaultsFollowOpenAi) {
  CompletionParams p;
  ASSERT_FALSE(Parse(R"({"prompt":"x"})", false, &p));
  EXPECT_EQ(p.max_tokens, 16);  // completions default
  EXPECT_FLOAT_EQ(p.temperature, 1.0f);
  EXPECT_EQ(p.n, 1);
  EXPECT_FALSE(p.stream);
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"user","content":"x"}]})", true, &p));
  EXPECT_EQ(p.max_tokens, -1);  // chat: until a stop or the context
}

TEST(OpenAiProtocolTest, PromptForms) {
  CompletionParams p;
  ASSERT_FALSE(Parse(R"({"prompt":["one"]})", false, &p));
  EXPECT_EQ(p.prompt, "one");
  ASSERT_FALSE(Parse(R"({"prompt":[1,2,3]})", false, &p));
  EXPECT_EQ(p.prompt_tokens, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_TRUE(Parse(R"({"prompt":["a","b"]})", false, &p));
  EXPECT_TRUE(Parse(R"({"prompt":[1,-2]})", false, &p));
  EXPECT_TRUE(Parse(R"({"prompt":""})", false, &p));
  EXPECT_TRUE(Parse(R"({"prompt":5})", false, &p));
}

TEST(OpenAiProtocolTest, ChatMessagesAndContentParts) {
  CompletionParams p;
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"system","content":"S"},
      {"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]}]})",
                     true, &p));
  ASSERT_EQ(p.messages.size(), 2u);
  EXPECT_EQ(p.messages[1].content, "ab");
  EXPECT_TRUE(Parse(R"({"messages":[]})", true, &p));
  EXPECT_TRUE(Parse(R"({"messages":[{"role":"tool","content":"x"}]})", true, &p));
  EXPECT_TRUE(Parse(R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}]})", true, &p));
}

TEST(OpenAiProtocolTest, BadInputNamesTheField) {
  CompletionParams p;
  struct Case {
    const char* body;
    const char* param;
  } cases[] = {
      {R"({"prompt":"x","max_tokens":0})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":"5"})", "max_tokens"},
      {R"({"prompt":"x","max_tokens":1.5})", "max_tokens"},
      {R"({"prompt":"x","temperature":3})", "temperature"},
      {R"({"prompt":"x","top_p":0})", "top_p"},
      {R"({"prompt":"x","n":0})", "n"},
      {R"({"prompt":"x","n":1000})", "n"},
      {R"({"prompt":"x","stop":[1]})", "stop"},
      {R"({"prompt":"x","seed":"s"})", "seed"},
      {R"({"prompt":"x","stream":"yes"})", "stream"},
      {R"({"prompt":"x","stream_options":{"include_usage":1}})", "stream_options"},
      {R"({"prompt":"x","model":3})", "model"},
  };
  for (const Case& c : cases) {
    auto e = Parse(c.body, false, &p);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, c.param) << c.body;
  }
  for (const char* body : {"", "{", "[1]", "null", "{\"prompt\": \"x\",}"}) {
    auto e = Parse(body, false, &p);
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->status, 400);
  }
}

// Found writing fuzz/request_fuzz.cc (the target aborts on it): a content part whose "type"
// is not a string threw
// json::type_error (the server answered 500) instead of giving a 400 naming the field.
TEST(OpenAiProtocolTest, ContentPartMembersOfTheWrongTypeAreABadRequest) {
  CompletionParams p;
  for (const char* parts : {R"([{"type":5}])", R"([{"type":null,"text":"x"}])",
                            R"([{"type":["text"],"text":"x"}])", R"([{"type":"text","text":7}])",
                            R"([{"type":"text"}])", R"([5])"}) {
    const std::string body =
        std::string(R"({"messages":[{"role":"user","content":)") + parts + "}]}";
    std::optional<ApiError> e;
    ASSERT_NO_THROW(e = Parse(body, true, &p)) << body;
    ASSERT_TRUE(e) << body;
    EXPECT_EQ(e->status, 400);
    EXPECT_EQ(e->param, "messages");
  }
  ASSERT_FALSE(Parse(R"({"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]})",
                     true, &p));
  EXPECT_EQ(p.messages[0].content, "x");
}

TEST(OpenAiProtocolTest, ErrorJsonHasOpenAiShapeAndSurvivesInvalidUtf8) {
  ApiError e;
  e.message = "bad \xff byte";
  e.param = "prompt";
  const auto j = nlohmann::json::parse(ErrorJson(e));
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["param"], "prompt");
  EXPECT_TRUE(j["error"]["code"].is_null());
}

}  // namespace
}  // namespace kvllm::server
