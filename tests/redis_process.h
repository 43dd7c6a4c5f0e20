// A redis-server child process for tests: on 127.0.0.1, keeping nothing on disk, killed
// (SIGKILL) by Kill(), when the object goes, or when the test process dies, so no test leaves
// one running.
#pragma once

#include <sys/types.h>

#include <string>

namespace kvllm::testing {

// A free TCP port on 127.0.0.1 (the kernel's pick; free again once this returns).
int FreePort();
// Whether something accepts connections on 127.0.0.1:port.
bool Accepting(int port);
bool HaveRedisServer();

class RedisProcess {
 public:
  explicit RedisProcess(int port) : port_(port) { Start(); }
  ~RedisProcess() { Kill(); }
  RedisProcess(const RedisProcess&) = delete;
  RedisProcess& operator=(const RedisProcess&) = delete;

  // Starts the server and waits (up to 10 s) until it accepts connections; ok() says whether.
  void Start();
  void Kill();
  bool ok() const { return pid_ > 0; }
  pid_t pid() const { return pid_; }
  int port() const { return port_; }
  std::string url(int db = 0) const {
    return "redis://127.0.0.1:" + std::to_string(port_) + "/" + std::to_string(db);
  }

 private:
  int port_;
  pid_t pid_ = -1;
};

}  // namespace kvllm::testing
