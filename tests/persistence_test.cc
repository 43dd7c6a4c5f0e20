// Conversations that outlive a server: `kvllm serve` with a disk tier restarted, two servers
// sharing one Redis, and servers killed with SIGKILL while writing blocks. Greedy f32 replies
// must equal those of a server without any tier; the history must come from the tier.
#include <gtest/gtest.h>
#include <httplib.h>

#include <filesystem>
#include <fstream>
#include <random>
#include <thread>

#include <nlohmann/json.hpp>

#include "kv/block_record.h"
#include "redis_process.h"
#include "server_process.h"
#include "test_support.h"

namespace kvllm {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;
using testing::ServerProcess;

std::string Model() {
  return testing::TestModel("tiny-f32-s7-ctx2k", "--preset tiny --type f32 --seed 7 --ctx 2048");
}
const std::string kArgs = " -ctk f32 -ctv f32 -t 2 -c 2048 ";

std::string Dir(const std::string& name) {
  const std::string d = testing::BinaryDir() + "/persistence-test-" + name;
  fs::remove_all(d);
  return d;
}

json Chat(const ServerProcess& s, const json& messages, int* status) {
  httplib::Client c("127.0.0.1", s.port());
  c.set_read_timeout(120, 0);
  json body = {{"messages", messages}, {"max_tokens", 12}, {"temperature", 0}};
  auto res = c.Post("/v1/chat/completions", body.dump(), "application/json");
  *status = res ? res->status : -1;
  return res ? json::parse(res->body, nullptr, false) : json();
}

const std::string kSystem =
    "You are a careful assistant who answers in complete sentences and keeps a long memory of "
    "everything that was said in this conversation, including every name and every number.";

// Runs turn 1 on `first`, turn 2 on `second`; returns turn 2's response.
json TwoTurns(const ServerProcess& first, const ServerProcess* second, std::string* reply1) {
  json messages = {{{"role", "system"}, {"content", kSystem}},
                   {{"role", "user"}, {"content", "Tell me about the garden."}}};
  int status = 0;
  json r1 = Chat(first, messages, &status);
  EXPECT_EQ(status, 200);
  *reply1 = r1["choices"][0]["message"]["content"].get<std::string>();
  messages.push_back({{"role", "assistant"}, {"content", *reply1}});
  messages.push_back({{"role", "user"}, {"content", "And the house?"}});
  json r2 = Chat(second == nullptr ? first : *second, messages, &status);
  EXPECT_EQ(status, 200);
  return r2;
}

// Turn 2 on a server without any tier and without history: what the reply must be.
json Baseline(std::string* reply1) {
  ServerProcess plain("-m " + Model() + kArgs);
  EXPECT_TRUE(plain.ok()) << plain.log();
  return TwoTurns(plain, nullptr, reply1);
}

TEST(PersistenceTest, RestartedServerContinuesTheConversationFromDisk) {
  std::string base1;
  const json expected = Baseline(&base1);
  const std::string dir = Dir("restart");
  std::string reply1;
  json turn2;
  {
    ServerProcess before("-m " + Model() + kArgs + "--kv-store-dir " + dir);
    ASSERT_TRUE(before.ok()) << before.log();
    json messages = {{{"role", "system"}, {"content", kSystem}},
                     {{"role", "user"}, {"content", "Tell me about the garden."}}};
    int status = 0;
    reply1 = Chat(before, messages, &status)["choices"][0]["message"]["content"];
    EXPECT_EQ(before.Stop(), 0);
    // The server went through its whole shutdown: "stopped" is its last line.
    EXPECT_NE(before.log().find("kvllm serve: stopped"), std::string::npos) << before.log();
  }
  EXPECT_EQ(reply1, base1);
  ServerProcess after("-m " + Model() + kArgs + "--kv-store-dir " + dir);
  ASSERT_TRUE(after.ok()) << after.log();
  json messages = {{{"role", "system"}, {"content", kSystem}},
                   {{"role", "user"}, {"content", "Tell me about the garden."}},
                   {{"role", "assistant"}, {"content", reply1}},
                   {{"role", "user"}, {"content", "And the house?"}}};
  int status = 0;
  turn2 = Chat(after, messages, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(turn2["choices"][0]["message"]["content"], expected["choices"][0]["message"]["content"]);
  // The first turn's prompt (system + user) is history now: whole blocks of it came from disk.
  const int cached = turn2["usage"]["prompt_tokens_details"]["cached_tokens"];
  EXPECT_GE(cached, 48) << turn2.dump();
  httplib::Client c("127.0.0.1", after.port());
  auto kv = json::parse(c.Get("/kv")->body);
  EXPECT_EQ(kv["store"][0]["tier"], "disk");
  EXPECT_EQ(kv["store"][0]["hits"].get<int>() * 16, cached);
  EXPECT_EQ(kv["recent"][0]["stored_tokens"], cached);
}

TEST(PersistenceTest, TwoServersOnOneRedisServeEachOthersConversations) {
  if (!testing::HaveRedisServer()) GTEST_SKIP() << "redis-server is not installed";
  testing::RedisProcess redis(testing::FreePort());
  ASSERT_TRUE(redis.ok());
  std::string base1, reply1;
  const json expected = Baseline(&base1);
  ServerProcess a("-m " + Model() + kArgs + "--kv-store-redis " + redis.url());
  ServerProcess b("-m " + Model() + kArgs + "--kv-store-redis " + redis.url());
  ASSERT_TRUE(a.ok() && b.ok()) << a.log() << b.log();
  // Turn 1 on A; A's writer is asynchronous, so give it a moment before B asks.
  json messages = {{{"role", "system"}, {"content", kSystem}},
                   {{"role", "user"}, {"content", "Tell me about the garden."}}};
  int status = 0;
  reply1 = Chat(a, messages, &status)["choices"][0]["message"]["content"];
  httplib::Client ca("127.0.0.1", a.port());
  for (int i = 0; i < 3000; ++i) {
    auto kv = json::parse(ca.Get("/kv")->body);
    if (kv["store"][0]["writes"].get<int>() >= 3) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  messages.push_back({{"role", "assistant"}, {"content", reply1}});
  messages.push_back({{"role", "user"}, {"content", "And the house?"}});
  const json turn2 = Chat(b, messages, &status);
  ASSERT_EQ(status, 200);
  EXPECT_EQ(turn2["choices"][0]["message"]["content"], expected["choices"][0]["message"]["content"]);
  EXPECT_GE(turn2["usage"]["prompt_tokens_details"]["cached_tokens"].get<int>(), 48);
  httplib::Client cb("127.0.0.1", b.port());
  EXPECT_GE(json::parse(cb.Get("/kv")->body)["store"][0]["hits"].get<int>(), 3);

  // Redis goes away: both servers go on answering, from memory and by computing.
  redis.Kill();
  const json again = Chat(b, messages, &status);
  EXPECT_EQ(status, 200);
  EXPECT_EQ(again["choices"][0]["message"]["content"], expected["choices"][0]["message"]["content"]);
  messages.back()["content"] = "And the river?";
  Chat(a, messages, &status);
  EXPECT_EQ(status, 200);
}

// SIGKILL while blocks are being written, again and again: no stored entry is ever corrupt,
// and a server started on what is left answers exactly as a server without a tier.
TEST(PersistenceTest, KillNineWhileWritingNeverLeavesACorruptEntry) {
  const std::string dir = Dir("kill9");
  std::mt19937 rng(7);
  auto prompt = [](int i) {
    std::vector<int32_t> p;
    for (int j = 0; j < 200 + 37 * i; ++j) p.push_back(3 + (i * 389 + j * 61) % 500);
    return p;
  };
  for (int round = 0; round < 5; ++round) {
    ServerProcess s("-m " + Model() + kArgs + "--kv-store-dir " + dir);
    ASSERT_TRUE(s.ok()) << s.log();
    std::vector<std::thread> clients;
    for (int i = 0; i < 4; ++i) {
      clients.emplace_back([&, i] {
        httplib::Client c("127.0.0.1", s.port());
        json body = {{"prompt", prompt(round * 4 + i)}, {"max_tokens", 64}, {"ignore_eos", true}};
        c.Post("/v1/completions", body.dump(), "application/json");  // may die with the server
      });
    }
    if (round == 0) {
      // However slow the build (sanitizers), the first server dies only once it has written.
      httplib::Client c("127.0.0.1", s.port());
      for (int i = 0; i < 3000; ++i) {
        auto kv = c.Get("/kv");
        if (kv && json::parse(kv->body)["store"][0]["writes"].get<int>() > 0) break;
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      }
    } else {
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution(100, 600)(rng)));
    }
    s.Crash();
    for (auto& t : clients) t.join();
  }
  size_t files = 0;
  for (const auto& e : fs::recursive_directory_iterator(dir)) {
    if (e.path().extension() != ".kvb") continue;
    ++files;
    std::ifstream in(e.path(), std::ios::binary);
    const std::vector<uint8_t> bytes{std::istreambuf_iterator<char>(in), {}};
    EXPECT_TRUE(DecodeBlock(bytes).ok()) << e.path();
  }
  EXPECT_GT(files, 0u);

  ServerProcess plain("-m " + Model() + kArgs);
  ServerProcess stored("-m " + Model() + kArgs + "--kv-store-dir " + dir);
  ASSERT_TRUE(plain.ok() && stored.ok()) << plain.log() << stored.log();
  for (int i = 0; i < 20; ++i) {
    json body = {{"prompt", prompt(i)}, {"max_tokens", 8}, {"temperature", 0}};
    httplib::Client cp("127.0.0.1", plain.port()), cs("127.0.0.1", stored.port());
    cp.set_read_timeout(60, 0);
    cs.set_read_timeout(60, 0);
    auto rp = cp.Post("/v1/completions", body.dump(), "application/json");
    auto rs = cs.Post("/v1/completions", body.dump(), "application/json");
    ASSERT_TRUE(rp && rs);
    EXPECT_EQ(json::parse(rs->body)["choices"][0]["text"], json::parse(rp->body)["choices"][0]["text"])
        << "prompt " << i;
  }
  httplib::Client cs("127.0.0.1", stored.port());
  EXPECT_GT(json::parse(cs.Get("/kv")->body)["store"][0]["hits"].get<int>(), 0);
}

}  // namespace
}  // namespace kvllm
