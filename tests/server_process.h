// A `kvllm serve` child process for end-to-end tests: started on 127.0.0.1 with a free port,
// stopped (SIGTERM, then SIGKILL) when the object goes, so no test leaves a server behind.
#pragma once

#include <sys/types.h>

#include <mutex>
#include <string>
#include <thread>

namespace kvllm::testing {

class ServerProcess {
 public:
  // `args`: everything after `kvllm serve` except the host and port. Waits up to 60 s for
  // the server to listen; ok() says whether it did (log() says why not).
  explicit ServerProcess(const std::string& args);
  ~ServerProcess();
  ServerProcess(const ServerProcess&) = delete;
  ServerProcess& operator=(const ServerProcess&) = delete;

  bool ok() const { return port_ > 0; }
  int port() const { return port_; }
  // The server's process id while it runs (for /proc/PID/status), -1 once stopped.
  pid_t pid() const { return pid_; }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port_); }
  std::string log() const;
  // Sends SIGTERM and waits (up to 10 s) for a clean exit; returns the exit status, or -1
  // (and prints the log). After an exit log() holds everything the server wrote.
  int Stop();
  // Kills it with SIGKILL at once (a crash), and reaps it.
  void Crash();

 private:
  pid_t pid_ = -1;
  int port_ = 0;
  int fd_ = -1;
  std::thread reader_;
  mutable std::mutex mu_;
  std::string log_;
};

}  // namespace kvllm::testing
