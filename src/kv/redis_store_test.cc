#include "kv/redis_store.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <hiredis/hiredis.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <string>
#include <thread>
#include <vector>

#include "redis_process.h"

namespace kvllm {
namespace {

using testing::Accepting;
using testing::FreePort;
using testing::HaveRedisServer;
using RedisServer = testing::RedisProcess;

using Clock = std::chrono::steady_clock;

#define REQUIRE_REDIS_SERVER()                                                             \
  if (!HaveRedisServer()) {                                                                \
    GTEST_SKIP() << "redis-server is not installed (scripts/install-deps.sh installs it)"; \
  }

std::vector<uint8_t> Bytes(std::string_view text) { return {text.begin(), text.end()}; }

std::unique_ptr<RedisStore> MustConnect(const std::string& url, uint32_t ttl = 0) {
  auto store = RedisStore::Connect(url, "test:", ttl);
  EXPECT_TRUE(store.ok()) << store.status().message();
  return store.ok() ? std::move(store).value() : nullptr;
}

double SecondsSince(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

TEST(RedisStoreTest, ParsesUrlsStrictly) {
  auto a = ParseRedisUrl("redis://127.0.0.1:6380/3");
  ASSERT_TRUE(a.ok()) << a.status().message();
  EXPECT_EQ(a->host, "127.0.0.1");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 3);
  auto b = ParseRedisUrl("redis://cache-1.local");
  ASSERT_TRUE(b.ok()) << b.status().message();
  EXPECT_EQ(b->host, "cache-1.local");
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->db, 0);
  EXPECT_TRUE(ParseRedisUrl("redis://localhost:6379/").ok());

  const std::pair<const char*, const char*> bad[] = {
      {"127.0.0.1:6379", "must start with redis://"},
      {"rediss://host", "must start with redis://"},
      {"redis://", "host '' is not a host name"},
      {"redis://:6379", "host '' is not a host name"},
      {"redis://host:", "port must be a number"},
      {"redis://host:0", "port must be a number"},
      {"redis://host:65536", "port must be a number"},
      {"redis://host:63a9", "port must be a number"},
      {"redis://host:-1", "port must be a number"},
      {"redis://host:1:2", "port must be a number"},
      {"redis://host/x", "database must be a number"},
      {"redis://host/-1", "database must be a number"},
      {"redis://host/1/2", "database must be a number"},
      {"redis://user:pw@host", "user and password"},
      {"redis://host?timeout=1", "options"},
      {"redis://[::1]:6379", "IPv6"},
      {"redis://ho st", "not a host name"},
  };
  for (const auto& [url, why] : bad) {
    const auto parsed = ParseRedisUrl(url);
    ASSERT_FALSE(parsed.ok()) << url;
    EXPECT_NE(parsed.status().message().find(why), std::string::npos)
        << url << ": " << parsed.status().message();
  }
  EXPECT_FALSE(RedisStore::Connect("redis//127.0.0.1").ok());
}

TEST(RedisStoreTest, PutGetMissRemoveBinarySafe) {
  REQUIRE_REDIS_SERVER();
  RedisServer server(FreePort());
  ASSERT_TRUE(server.ok());
  auto store = MustConnect(server.url(2));
  ASSERT_NE(store, nullptr);
  EXPECT_STREQ(store->name(), "redis");
  EXPECT_EQ(store->KeyOf(0xabcdef0123456789), "test:abcdef0123456789");

  auto miss = store->Get(7);
  ASSERT_TRUE(miss.ok()) << miss.status().message();
  EXPECT_FALSE(miss->has_value());
  EXPECT_FALSE(store->Contains(7));

  std::vector<uint8_t> bytes = Bytes("KVLLMBLK");
  for (int i = 0; i < 70000; ++i) bytes.push_back(static_cast<uint8_t>(i * 13));  // NULs too
  ASSERT_TRUE(store->Put(7, bytes).ok());
  EXPECT_TRUE(store->Contains(7));
  auto hit = store->Get(7);
  ASSERT_TRUE(hit.ok()) << hit.status().message();
  ASSERT_TRUE(hit->has_value());
  EXPECT_EQ(**hit, bytes);

  ASSERT_TRUE(store->Put(7, Bytes("second")).ok());  // replaces
  EXPECT_EQ(store->Get(7)->value(), Bytes("second"));

  // The URL's database is used: another database does not see the key.
  auto other_db = MustConnect(server.url(0));
  ASSERT_NE(other_db, nullptr);
  EXPECT_FALSE(other_db->Contains(7));

  const auto no_db = RedisStore::Connect(server.url(100000));  // Redis has 16 by default
  ASSERT_FALSE(no_db.ok());
  EXPECT_NE(no_db.status().message().find("DB index is out of range"), std::string::npos)
      << no_db.status().message();

  ASSERT_TRUE(store->Remove(7).ok());
  EXPECT_FALSE(store->Contains(7));
  EXPECT_FALSE(store->Get(7)->has_value());
  EXPECT_TRUE(store->Remove(7).ok());  // absent: still OK
}

// Redis's own view of a key's time to live: -1 without one, -2 for no key.
long long RawTtl(int port, const std::string& key) {
  redisContext* c = redisConnect("127.0.0.1", port);
  auto* r = static_cast<redisReply*>(redisCommand(c, "TTL %s", key.c_str()));
  const long long ttl = r != nullptr && r->type == REDIS_REPLY_INTEGER ? r->integer : -100;
  freeReplyObject(r);
  redisFree(c);
  return ttl;
}

TEST(RedisStoreTest, TtlIsSetOnPut) {
  REQUIRE_REDIS_SERVER();
  RedisServer server(FreePort());
  ASSERT_TRUE(server.ok());
  auto expiring = MustConnect(server.url(), /*ttl=*/100);
  auto lasting = MustConnect(server.url());
  ASSERT_NE(expiring, nullptr);
  ASSERT_NE(lasting, nullptr);
  ASSERT_TRUE(expiring->Put(1, Bytes("a")).ok());
  ASSERT_TRUE(lasting->Put(2, Bytes("b")).ok());
  const long long ttl = RawTtl(server.port(), expiring->KeyOf(1));
  EXPECT_GT(ttl, 90);
  EXPECT_LE(ttl, 100);
  EXPECT_EQ(RawTtl(server.port(), lasting->KeyOf(2)), -1);
}

TEST(RedisStoreTest, ConnectingWhereNothingListensFailsQuickly) {
  const int port = FreePort();
  const auto start = Clock::now();
  auto store = RedisStore::Connect("redis://127.0.0.1:" + std::to_string(port));
  ASSERT_FALSE(store.ok());
  EXPECT_NE(store.status().message().find("cannot connect"), std::string::npos)
      << store.status().message();
  EXPECT_LT(SecondsSince(start), 1.5);
}

// A port that accepts connections but never answers: Connect gives up after the timeout.
TEST(RedisStoreTest, SilentServerTimesOut) {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof addr), 0);
  ASSERT_EQ(listen(fd, 4), 0);  // the kernel completes the handshake; nobody reads
  socklen_t len = sizeof addr;
  ASSERT_EQ(getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len), 0);
  const auto start = Clock::now();
  auto store = RedisStore::Connect("redis://127.0.0.1:" + std::to_string(ntohs(addr.sin_port)));
  EXPECT_FALSE(store.ok());
  EXPECT_GE(SecondsSince(start), 0.9);
  EXPECT_LT(SecondsSince(start), 3.0);
  close(fd);
}

TEST(RedisStoreTest, ServerDownGivesErrorsThenRecovers) {
  REQUIRE_REDIS_SERVER();
  const int port = FreePort();
  RedisServer server(port);
  ASSERT_TRUE(server.ok());
  auto store = MustConnect(server.url());
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->Put(1, Bytes("one")).ok());

  server.Kill();
  auto start = Clock::now();
  // Larger than the socket buffers, so hiredis writes again after the peer's reset: EPIPE,
  // which would raise SIGPIPE and kill the test without the store's guard.
  const std::vector<uint8_t> big(32 << 20, 0x5a);
  const Status put = store->Put(2, big);
  EXPECT_FALSE(put.ok());
  EXPECT_LT(SecondsSince(start), 1.5);
  // Within the reconnect interval, calls fail at once without touching the network.
  start = Clock::now();
  auto got = store->Get(1);
  ASSERT_FALSE(got.ok());
  EXPECT_NE(got.status().message().find("unavailable"), std::string::npos)
      << got.status().message();
  EXPECT_FALSE(store->Remove(1).ok());
  EXPECT_FALSE(store->Contains(1));
  EXPECT_LT(SecondsSince(start), 0.1);

  // Past the interval the store tries again, and fails again while nothing listens.
  std::this_thread::sleep_for(RedisStore::kReconnectInterval);
  const Status again = store->Put(3, Bytes("three"));
  EXPECT_FALSE(again.ok());
  EXPECT_NE(again.message().find("cannot connect"), std::string::npos) << again.message();

  server.Start();  // a fresh, empty Redis on the same port
  ASSERT_TRUE(server.ok());
  start = Clock::now();
  Status back = store->Put(4, Bytes("four"));
  while (!back.ok() && SecondsSince(start) < 5) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    back = store->Put(4, Bytes("four"));
  }
  ASSERT_TRUE(back.ok()) << back.message();
  EXPECT_EQ(store->Get(4)->value(), Bytes("four"));
  EXPECT_FALSE(store->Get(1)->has_value());  // the old server's data died with it
}

TEST(RedisStoreTest, StoppedServerTimesOutInsteadOfHanging) {
  REQUIRE_REDIS_SERVER();
  RedisServer server(FreePort());
  ASSERT_TRUE(server.ok());
  auto store = MustConnect(server.url());
  ASSERT_NE(store, nullptr);
  kill(server.pid(), SIGSTOP);
  const auto start = Clock::now();
  EXPECT_FALSE(store->Get(1).ok());
  EXPECT_LT(SecondsSince(start), 3.0);
  kill(server.pid(), SIGCONT);
}

TEST(RedisStoreTest, ConcurrentCallsShareOneConnection) {
  REQUIRE_REDIS_SERVER();
  RedisServer server(FreePort());
  ASSERT_TRUE(server.ok());
  auto store = MustConnect(server.url());
  ASSERT_NE(store, nullptr);
  std::atomic<int> failures{0};
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 200; ++i) {
        const BlockHash h = 100 * t + i % 10;
        const std::vector<uint8_t> value = Bytes("block " + std::to_string(h));
        failures += !store->Put(h, value).ok();
        auto got = store->Get(h);
        failures += !got.ok() || !got->has_value() || **got != value;
      }
    });
  }
  for (std::thread& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0);
}

}  // namespace
}  // namespace kvllm
