// RedisStore: the shared tier, one Redis string per block under key_prefix + 16 hex digits of
// the hash (e.g. "kvllm:block:abcdef0123456789"), so several servers share what any computed.
// Keys never contain request data.
//
// Guarantees:
// - Bounded waits: connecting and every command time out after kTimeout; a Redis that is
//   down or goes down gives a Status error, never a crash (SIGPIPE included) or a hang.
//   (A host name is resolved without a timeout: give an IP address where DNS may stall.)
// - Lazy reconnect: after a failure the connection is dropped; the next call reconnects, but
//   at most once per kReconnectInterval, and calls in between fail at once, so a dead Redis
//   costs a lookup nothing.
// - Thread-safe: one connection behind a mutex (calls are serialized).
#pragma once

#include <chrono>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <string_view>

#include "kv/kv_store.h"

struct redisContext;
struct redisReply;

namespace kvllm {

// A parsed "redis://host[:port][/db]" (port 6379 and db 0 by default).
struct RedisAddress {
  std::string host;
  int port = 6379;
  int db = 0;
};
// Fails with a message saying what is wrong with `url` (user info, query strings and IPv6
// literals are not supported).
StatusOr<RedisAddress> ParseRedisUrl(const std::string& url);

class RedisStore final : public KVStore {
 public:
  static constexpr std::chrono::milliseconds kTimeout{1000};
  static constexpr std::chrono::milliseconds kReconnectInterval{1000};

  // Connects (and SELECTs the db) now, so a bad URL or an unreachable Redis fails here.
  // ttl_seconds > 0 makes every Put expire after that long.
  static StatusOr<std::unique_ptr<RedisStore>> Connect(std::string url,
                                                       std::string key_prefix = "kvllm:block:",
                                                       uint32_t ttl_seconds = 0);
  ~RedisStore() override;
  RedisStore(const RedisStore&) = delete;
  RedisStore& operator=(const RedisStore&) = delete;

  const char* name() const override { return "redis"; }
  StatusOr<std::optional<std::vector<uint8_t>>> Get(BlockHash hash) override;
  Status Put(BlockHash hash, std::span<const uint8_t> encoded) override;
  Status Remove(BlockHash hash) override;
  bool Contains(BlockHash hash) override;

  std::string KeyOf(BlockHash hash) const;

 private:
  struct ReplyDeleter {
    void operator()(redisReply* r) const;
  };
  using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

  RedisStore(std::string url, RedisAddress address, std::string key_prefix, uint32_t ttl);
  // These require mu_. Reconnect makes a fresh connection in ctx_ and SELECTs the db.
  // Command runs one command (binary-safe arguments, at most 8), reconnecting first when
  // allowed; Send runs it on the live connection. A reply of Redis's error type is an error
  // too, but keeps the connection. Fail drops the connection after a failure of the
  // connection and returns the error to report; Disconnect drops it and holds off retries.
  Status Reconnect();
  StatusOr<Reply> Command(std::initializer_list<std::string_view> args);
  StatusOr<Reply> Send(std::initializer_list<std::string_view> args);
  Status Fail(const std::string& what);
  void Disconnect(std::string why);

  const std::string url_;
  const RedisAddress address_;
  const std::string key_prefix_;
  const uint32_t ttl_seconds_;

  std::mutex mu_;
  redisContext* ctx_ = nullptr;                        // null while disconnected
  std::chrono::steady_clock::time_point retry_after_;  // no reconnect before this
  std::string last_error_;
};

}  // namespace kvllm
