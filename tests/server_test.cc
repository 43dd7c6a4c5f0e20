// `kvllm serve` end to end over HTTP on 127.0.0.1: errors, 32 concurrent streams that equal
// solo runs and leak no block, a 1,000-token shared prefix served from the cache, a client
// that disconnects mid-stream, a full queue.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <regex>
#include <thread>

#include <nlohmann/json.hpp>

#include "server_process.h"
#include "test_support.h"

namespace kvllm {
namespace {

using nlohmann::json;
using testing::ServerProcess;
using testing::TestModel;

std::string TinyModel() {
  return TestModel("tiny-f32-s7-ctx2k", "--preset tiny --type f32 --seed 7 --ctx 2048");
}

std::string Bundled() { return testing::SourceDir() + "/models/kvllm-prose.gguf"; }

const std::string kF32 = " -ctk f32 -ctv f32 -t 2 ";

httplib::Client Client(const ServerProcess& s) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  return c;
}

json Post(const ServerProcess& s, const std::string& path, const json& body, int* status,
          const std::string& key = "") {
  httplib::Client c = Client(s);
  httplib::Headers h;
  if (!key.empty()) h.emplace("Authorization", "Bearer " + key);
  auto res = c.Post(path, h, body.dump(), "application/json");
  if (!res) {
    *status = -1;
    return json();
  }
  *status = res->status;
  return json::parse(res->body, nullptr, false);
}

json GetJson(const ServerProcess& s, const std::string& path) {
  auto res = Client(s).Get(path);
  return res ? json::parse(res->body, nullptr, false) : json();
}

double MetricValue(const std::string& text, const std::string& name) {
  std::smatch m;
  const std::regex re("\n" + std::regex_replace(name, std::regex(R"([{}"])"), R"(\$&)") +
                      R"( ([0-9.e+-]+)\n)");
  return std::regex_search(text, m, re) ? std::stod(m[1]) : -1;
}

std::vector<int32_t> Tokens(int32_t seed, int32_t n) {
  std::vector<int32_t> t(n);
  for (int32_t i = 0; i < n; ++i) t[i] = 3 + (seed * 977 + i * 131) % 500;
  return t;
}

// POSTs `body` and hands the response body to `receiver` as it arrives (false stops reading
// and closes the connection). The HTTP status, or -1 when the exchange failed.
int PostStreaming(const ServerProcess& s, const json& body,
                  std::function<bool(const char*, size_t)> receiver) {
  httplib::Client c = Client(s);
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.body = body.dump();
  req.set_header("Content-Type", "application/json");
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    return receiver(data, n);
  };
  httplib::Response res;
  httplib::Error err;
  const auto t0 = std::chrono::steady_clock::now();
  if (!c.send(req, res, err)) {
    if (err == httplib::Error::Canceled) return res.status;  // the receiver stopped reading
    ADD_FAILURE() << "POST failed: " << httplib::to_string(err) << " after "
                  << std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()
                  << " s, status " << res.status << " body " << body.dump().size();
    return -1;
  }
  return res.status;
}

struct StreamResult {
  int status = 0;
  std::string text;
  std::string finish_reason;
  bool done = false;  // saw data: [DONE]
};

// POSTs a streaming completion and parses its server-sent events.
StreamResult Stream(const ServerProcess& s, const json& body) {
  StreamResult r;
  std::string buffer;
  r.status = PostStreaming(s, body, [&](const char* data, size_t n) {
        buffer.append(data, n);
        size_t end;
        while ((end = buffer.find("\n\n")) != std::string::npos) {
          const std::string event = buffer.substr(0, end);
          buffer.erase(0, end + 2);
          if (event.rfind("data: ", 0) != 0) continue;
          const std::string payload = event.substr(6);
          if (payload == "[DONE]") {
            r.done = true;
            continue;
          }
          json j = json::parse(payload, nullptr, false);
          if (j.is_discarded()) {
            ADD_FAILURE() << "not JSON: " << payload;
            return false;
          }
          for (const json& ch : j["choices"]) {
            r.text += ch["text"].get<std::string>();
            if (!ch["finish_reason"].is_null()) r.finish_reason = ch["finish_reason"];
          }
        }
        return true;
      });
  return r;
}

TEST(ServerTest, HealthModelsAndErrors) {
  ServerProcess s("-m " + TinyModel() + kF32 + "-c 2048 --alias tiny");
  ASSERT_TRUE(s.ok()) << s.log();
  EXPECT_EQ(GetJson(s, "/health")["status"], "ok");
  EXPECT_EQ(GetJson(s, "/v1/models")["data"][0]["id"], "tiny");

  int status = 0;
  json ok = Post(s, "/v1/completions", {{"prompt", "hello"}, {"max_tokens", 3}}, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(ok["object"], "text_completion");
  EXPECT_EQ(ok["usage"]["completion_tokens"].get<int>() <= 3, true);

  auto res = Client(s).Post("/v1/completions", "{not json", "application/json");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 400);
  EXPECT_EQ(json::parse(res->body)["error"]["type"], "invalid_request_error");

  json e = Post(s, "/v1/completions", {{"prompt", "x"}, {"temperature", 9}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["param"], "temperature");

  e = Post(s, "/v1/completions", {{"prompt", Tokens(1, 3000)}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_EQ(e["error"]["code"], "context_length_exceeded");

  e = Post(s, "/v1/completions", {{"prompt", {1, 2, 1 << 20}}}, &status);
  EXPECT_EQ(status, 400);
  EXPECT_NE(e["error"]["message"].get<std::string>().find("vocabulary"), std::string::npos);

  res = Client(s).Get("/v1/nothing");
  ASSERT_TRUE(res);
  EXPECT_EQ(res->status, 404);
  EXPECT_TRUE(json::parse(res->body)["error"].is_object());
  EXPECT_EQ(s.Stop(), 0);
}

TEST(ServerTest, ApiKeyIsRequiredOnV1Only) {
  ServerProcess s("-m " + TinyModel() + kF32 + "-c 256 --api-key sekret");
  ASSERT_TRUE(s.ok()) << s.log();
  int status = 0;
  json body = {{"prompt", "hi"}, {"max_tokens", 2}};
  json e = Post(s, "/v1/completions", body, &status);
  EXPECT_EQ(status, 401);
  EXPECT_EQ(e["error"]["code"], "invalid_api_key");
  Post(s, "/v1/completions", body, &status, "sekre");
  EXPECT_EQ(status, 401);
  Post(s, "/v1/completions", body, &status, "sekret");
  EXPECT_EQ(status, 200);
  EXPECT_EQ(GetJson(s, "/health")["status"], "ok");
}

// 32 clients stream at once; every output equals the same request alone on a server that
// runs one sequence at a time without the prefix cache, and afterwards no block is held.
TEST(ServerTest, ThirtyTwoConcurrentStreamsMatchSoloRunsAndLeakNoBlock) {
  constexpr int kClients = 32;
  auto body = [](int i) {
    return json{{"prompt", Tokens(i, 10 + 5 * i)}, {"max_tokens", 12}, {"temperature", 0},
                {"ignore_eos", true}, {"stream", true}};
  };
  std::vector<StreamResult> batched(kClients);
  int max_running = 0;
  {
    ServerProcess s("-m " + TinyModel() + kF32 + "-c 2048");
    ASSERT_TRUE(s.ok()) << s.log();
    std::vector<std::thread> clients;
    std::atomic<int> finished{0};
    for (int i = 0; i < kClients; ++i) {
      clients.emplace_back([&, i] {
        batched[i] = Stream(s, body(i));
        ++finished;
      });
    }
    for (int polls = 0; polls < 3000 && finished < kClients; ++polls) {
      auto m = Client(s).Get("/metrics");
      if (m) max_running = std::max<int>(max_running, MetricValue(m->body, "kvllm:num_requests_running"));
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (auto& t : clients) t.join();
    if (HasFailure()) ADD_FAILURE() << "server log:\n" << s.log();
    const json kv = GetJson(s, "/kv");
    EXPECT_EQ(kv["integrity"], "ok");
    EXPECT_EQ(kv["blocks"]["used"], 0);
    EXPECT_EQ(kv["blocks"]["free"].get<int>() + kv["blocks"]["cached_free"].get<int>(),
              kv["blocks"]["total"].get<int>());
    EXPECT_TRUE(kv["requests"].empty());
    EXPECT_EQ(s.Stop(), 0);
  }
  EXPECT_GT(max_running, 1) << "the requests never shared a batch";
  ServerProcess solo("-m " + TinyModel() + kF32 + "-c 2048 --max-num-seqs 1 --no-prefix-caching");
  ASSERT_TRUE(solo.ok()) << solo.log();
  for (int i = 0; i < kClients; ++i) {
    const StreamResult& b = batched[i];
    EXPECT_EQ(b.status, 200);
    EXPECT_TRUE(b.done) << "request " << i;
    EXPECT_EQ(b.finish_reason, "length");
    json alone = body(i);
    alone["stream"] = false;
    int status = 0;
    json r = Post(solo, "/v1/completions", alone, &status);
    ASSERT_EQ(status, 200);
    EXPECT_EQ(b.text, r["choices"][0]["text"].get<std::string>()) << "request " << i;
  }
}

TEST(ServerTest, SecondRequestReusesAThousandTokenSystemPrompt) {
  ServerProcess s("-m " + TinyModel() + kF32 + "-c 2048");
  ASSERT_TRUE(s.ok()) << s.log();
  const std::vector<int32_t> system = Tokens(5, 1000);
  auto with = [&](std::vector<int32_t> suffix) {
    std::vector<int32_t> p = system;
    p.insert(p.end(), suffix.begin(), suffix.end());
    return json{{"prompt", p}, {"max_tokens", 4}, {"temperature", 0}};
  };
  int status = 0;
  json a = Post(s, "/v1/completions", with({11, 12, 13, 14, 15}), &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(a["usage"]["prompt_tokens_details"]["cached_tokens"], 0);
  json b = Post(s, "/v1/completions", with({21, 22, 23, 24, 25, 26, 27}), &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(b["usage"]["prompt_tokens"], 1007);
  EXPECT_GE(b["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 992);
  // Only the suffix was computed: /kv reports what the prefill computed.
  const json recent = GetJson(s, "/kv")["recent"];
  ASSERT_EQ(recent.size(), 2u);
  EXPECT_EQ(recent[1]["cached_tokens"], 992);
  EXPECT_EQ(recent[1]["prefilled_tokens"], 1007 - 992);
  EXPECT_EQ(recent[0]["prefilled_tokens"], 1005);
  auto m = Client(s).Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(MetricValue(m->body, "kvllm:prefix_cache_hits_total"), 992);
}

TEST(ServerTest, ClientThatDisconnectsMidStreamIsCancelled) {
  ServerProcess s("-m " + Bundled() + " -t 2");
  ASSERT_TRUE(s.ok()) << s.log();
  int chunks = 0;
  json body = {{"prompt", "It was"}, {"max_tokens", 400}, {"ignore_eos", true}, {"stream", true}};
  PostStreaming(s, body, [&](const char*, size_t) { return ++chunks < 2; });
  EXPECT_GE(chunks, 1);
  json kv;
  for (int i = 0; i < 200; ++i) {
    kv = GetJson(s, "/kv");
    if (kv["requests"].empty()) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  EXPECT_TRUE(kv["requests"].empty());
  EXPECT_EQ(kv["blocks"]["used"], 0);
  EXPECT_EQ(kv["integrity"], "ok");
  auto m = Client(s).Get("/metrics");
  ASSERT_TRUE(m);
  EXPECT_EQ(MetricValue(m->body, "kvllm:request_success_total{finished_reason=\"abort\"}"), 1);
}

TEST(ServerTest, FullQueueAnswers503AndTheRestSucceed) {
  ServerProcess s("-m " + Bundled() + " -t 2 --max-num-seqs 1 --max-queue 1");
  ASSERT_TRUE(s.ok()) << s.log();
  // One runs and one waits at a time: of six sent at once, some must be turned away.
  std::vector<int> statuses(6);
  std::vector<std::thread> clients;
  for (int i = 0; i < 6; ++i) {
    clients.emplace_back([&, i] {
      json body = {{"prompt", "Once"}, {"max_tokens", 400}, {"ignore_eos", true}};
      Post(s, "/v1/completions", body, &statuses[i]);
    });
  }
  for (auto& t : clients) t.join();
  EXPECT_GE(std::count(statuses.begin(), statuses.end(), 503), 1);
  EXPECT_GE(std::count(statuses.begin(), statuses.end(), 200), 1);
  EXPECT_EQ(std::count(statuses.begin(), statuses.end(), 200) +
                std::count(statuses.begin(), statuses.end(), 503),
            6);
}

}  // namespace
}  // namespace kvllm
