#include "kv/redis_store.h"

#include <hiredis/hiredis.h>
#include <pthread.h>
#include <signal.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <cinttypes>
#include <cstdio>

namespace kvllm {
namespace {

// hiredis sends with write(2); on a connection the server has closed that raises SIGPIPE,
// whose default action kills the process. This blocks SIGPIPE in the calling thread for the
// guard's life and swallows one raised meanwhile, leaving the process's handlers alone (a
// library must not change them).
class SigpipeGuard {
 public:
  SigpipeGuard() {
    sigemptyset(&pipe_);
    sigaddset(&pipe_, SIGPIPE);
    sigset_t pending;
    sigpending(&pending);
    was_pending_ = sigismember(&pending, SIGPIPE) == 1;
    pthread_sigmask(SIG_BLOCK, &pipe_, &old_mask_);
  }
  ~SigpipeGuard() {
    if (!was_pending_) {
      const timespec zero{0, 0};
      sigtimedwait(&pipe_, nullptr, &zero);
    }
    pthread_sigmask(SIG_SETMASK, &old_mask_, nullptr);
  }
  SigpipeGuard(const SigpipeGuard&) = delete;
  SigpipeGuard& operator=(const SigpipeGuard&) = delete;

 private:
  sigset_t pipe_;
  sigset_t old_mask_;
  bool was_pending_ = false;
};

// Parses all of `text` as a decimal integer in [lo, hi].
std::optional<int> ParseInt(std::string_view text, int lo, int hi) {
  int value = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || text[0] == '-' || ec != std::errc() || end != text.data() + text.size() ||
      value < lo || value > hi) {
    return std::nullopt;
  }
  return value;
}

bool ValidHost(std::string_view host) {
  return !host.empty() && std::all_of(host.begin(), host.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '.' ||
           c == '-' || c == '_';
  });
}

std::string_view Bytes(std::span<const uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

}  // namespace

StatusOr<RedisAddress> ParseRedisUrl(const std::string& url) {
  auto bad = [&url](const std::string& why) {
    return Status::Error("bad redis URL '" + url + "': " + why +
                         " (expected redis://host[:port][/db])");
  };
  constexpr std::string_view kScheme = "redis://";
  if (!url.starts_with(kScheme)) return bad("it must start with redis://");
  std::string_view rest = std::string_view(url).substr(kScheme.size());
  if (rest.find('@') != std::string_view::npos) return bad("user and password are not supported");
  if (rest.find_first_of("?#") != std::string_view::npos) return bad("options are not supported");
  if (rest.starts_with('[')) return bad("IPv6 addresses are not supported");

  RedisAddress address;
  const size_t slash = rest.find('/');
  if (slash != std::string_view::npos) {
    const std::string_view db = rest.substr(slash + 1);
    if (!db.empty()) {
      const std::optional<int> n = ParseInt(db, 0, 1 << 30);
      if (!n) return bad("the database must be a number, not '" + std::string(db) + "'");
      address.db = *n;
    }
    rest = rest.substr(0, slash);
  }
  const size_t colon = rest.find(':');
  if (colon != std::string_view::npos) {
    const std::string_view port = rest.substr(colon + 1);
    const std::optional<int> n = ParseInt(port, 1, 65535);
    if (!n) return bad("the port must be a number in 1..65535, not '" + std::string(port) + "'");
    address.port = *n;
    rest = rest.substr(0, colon);
  }
  if (!ValidHost(rest)) return bad("the host '" + std::string(rest) + "' is not a host name");
  address.host = rest;
  return address;
}

void RedisStore::ReplyDeleter::operator()(redisReply* r) const { freeReplyObject(r); }

StatusOr<std::unique_ptr<RedisStore>> RedisStore::Connect(std::string url, std::string key_prefix,
                                                          uint32_t ttl_seconds) {
  KVLLM_ASSIGN_OR_RETURN(RedisAddress address, ParseRedisUrl(url));
  std::unique_ptr<RedisStore> store(
      new RedisStore(std::move(url), std::move(address), std::move(key_prefix), ttl_seconds));
  std::lock_guard lock(store->mu_);
  KVLLM_RETURN_IF_ERROR(store->Reconnect());
  return store;
}

RedisStore::RedisStore(std::string url, RedisAddress address, std::string key_prefix, uint32_t ttl)
    : url_(std::move(url)),
      address_(std::move(address)),
      key_prefix_(std::move(key_prefix)),
      ttl_seconds_(ttl) {}

RedisStore::~RedisStore() {
  if (ctx_ != nullptr) redisFree(ctx_);
}

std::string RedisStore::KeyOf(BlockHash hash) const {
  char hex[17];
  std::snprintf(hex, sizeof hex, "%016" PRIx64, hash);
  return key_prefix_ + hex;
}

StatusOr<std::optional<std::vector<uint8_t>>> RedisStore::Get(BlockHash hash) {
  const std::string key = KeyOf(hash);
  std::lock_guard lock(mu_);
  auto reply = Command({"GET", key});
  if (!reply.ok()) return reply.status();
  const redisReply& r = **reply;
  if (r.type == REDIS_REPLY_NIL) return std::optional<std::vector<uint8_t>>();
  if (r.type != REDIS_REPLY_STRING) {
    return Status::Error("redis at " + url_ + ": GET " + key + " returned no string");
  }
  return std::optional<std::vector<uint8_t>>(std::vector<uint8_t>(r.str, r.str + r.len));
}

Status RedisStore::Put(BlockHash hash, std::span<const uint8_t> encoded) {
  const std::string key = KeyOf(hash);
  const std::string ttl = std::to_string(ttl_seconds_);
  std::lock_guard lock(mu_);
  auto reply = ttl_seconds_ > 0 ? Command({"SET", key, Bytes(encoded), "EX", ttl})
                                : Command({"SET", key, Bytes(encoded)});
  return reply.ok() ? Status::Ok() : reply.status();
}

Status RedisStore::Remove(BlockHash hash) {
  const std::string key = KeyOf(hash);
  std::lock_guard lock(mu_);
  auto reply = Command({"DEL", key});
  return reply.ok() ? Status::Ok() : reply.status();
}

bool RedisStore::Contains(BlockHash hash) {
  const std::string key = KeyOf(hash);
  std::lock_guard lock(mu_);
  auto reply = Command({"EXISTS", key});
  return reply.ok() && (*reply)->type == REDIS_REPLY_INTEGER && (*reply)->integer > 0;
}

Status RedisStore::Reconnect() {
  using std::chrono::duration_cast;
  using std::chrono::microseconds;
  const long long us = duration_cast<microseconds>(kTimeout).count();
  const timeval timeout{static_cast<time_t>(us / 1000000), static_cast<suseconds_t>(us % 1000000)};
  ctx_ = redisConnectWithTimeout(address_.host.c_str(), address_.port, timeout);
  if (ctx_ == nullptr || ctx_->err != 0) return Fail("cannot connect");
  if (redisSetTimeout(ctx_, timeout) != REDIS_OK) return Fail("cannot set a timeout");
  // SELECT also proves that a Redis answers there (a port that accepts and stays silent
  // fails here, after the timeout).
  const std::string db = std::to_string(address_.db);
  auto reply = Send({"SELECT", db});
  if (reply.ok()) return Status::Ok();
  // Redis refused the database: stay disconnected rather than use database 0.
  if (ctx_ != nullptr) Disconnect("SELECT " + db + " refused");
  return reply.status();
}

StatusOr<RedisStore::Reply> RedisStore::Command(std::initializer_list<std::string_view> args) {
  if (ctx_ == nullptr) {
    if (std::chrono::steady_clock::now() < retry_after_) {
      return Status::Error("redis at " + url_ + " is unavailable (" + last_error_ + ")");
    }
    KVLLM_RETURN_IF_ERROR(Reconnect());
  }
  return Send(args);
}

StatusOr<RedisStore::Reply> RedisStore::Send(std::initializer_list<std::string_view> args) {
  std::array<const char*, 8> argv;
  std::array<size_t, 8> lengths;
  KVLLM_CHECK(args.size() <= argv.size());
  size_t n = 0;
  for (std::string_view a : args) {
    argv[n] = a.data();
    lengths[n++] = a.size();
  }
  const std::string command(argv[0], lengths[0]);
  Reply reply;
  {
    SigpipeGuard guard;
    reply.reset(static_cast<redisReply*>(
        redisCommandArgv(ctx_, static_cast<int>(n), argv.data(), lengths.data())));
  }
  if (reply == nullptr) return Fail(command + " failed");
  if (reply->type == REDIS_REPLY_ERROR) {
    return Status::Error("redis at " + url_ + ": " + command + ": " +
                         std::string(reply->str, reply->len));
  }
  return reply;
}

Status RedisStore::Fail(const std::string& what) {
  std::string why = what;
  if (ctx_ != nullptr && ctx_->err != 0) why += std::string(": ") + ctx_->errstr;
  Disconnect(std::move(why));
  return Status::Error("redis at " + url_ + ": " + last_error_);
}

void RedisStore::Disconnect(std::string why) {
  last_error_ = std::move(why);
  if (ctx_ != nullptr) redisFree(ctx_);
  ctx_ = nullptr;
  retry_after_ = std::chrono::steady_clock::now() + kReconnectInterval;
}

}  // namespace kvllm
