#include "server/server.h"

#include <gtest/gtest.h>

#include <chrono>
#include <future>
#include <thread>

namespace kvllm::server {
namespace {

using namespace std::chrono_literals;

// Bind, Serve and Stop touch no engine: the routes that would are never called here.
Server Unbound() {
  ServerOptions o;
  o.host = "127.0.0.1";
  o.port = 0;
  return Server(o, nullptr, nullptr, nullptr, ChatTemplate(ChatTemplateKind::kChatML), 1);
}

// Serve() on another thread; true if it returned within 10 s. If it did not, stops the loop
// again (it runs by then) so that the test ends either way.
bool ServeReturns(Server& server, std::future<void>& serving) {
  if (serving.wait_for(10s) == std::future_status::ready) return true;
  server.Stop();
  serving.wait();
  return false;
}

TEST(ServerTest, StopEndsARunningServe) {
  Server server = Unbound();
  ASSERT_TRUE(server.Bind().ok());
  std::future<void> serving = std::async(std::launch::async, [&] { server.Serve(); });
  std::this_thread::sleep_for(50ms);
  std::thread stopper([&] { server.Stop(); });
  EXPECT_TRUE(ServeReturns(server, serving));
  stopper.join();
}

// A SIGTERM right after Bind() (kvllm serve's signal thread calls Stop()) must not be lost
// because the listen loop had not started yet.
TEST(ServerTest, StopBeforeTheListenLoopStartsEndsServeAtOnce) {
  Server server = Unbound();
  ASSERT_TRUE(server.Bind().ok());
  std::thread stopper([&] { server.Stop(); });
  std::this_thread::sleep_for(50ms);  // Stop() is waiting by now
  std::future<void> serving = std::async(std::launch::async, [&] { server.Serve(); });
  EXPECT_TRUE(ServeReturns(server, serving));
  stopper.join();
}

}  // namespace
}  // namespace kvllm::server
