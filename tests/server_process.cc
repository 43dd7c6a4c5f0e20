#include "server_process.h"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <regex>

#include "test_support.h"

namespace kvllm::testing {
namespace {

// Waits up to `ms` for `pid` to exit; its exit status, or -1 if it did not.
int WaitExit(pid_t pid, int ms) {
  for (int waited = 0; waited <= ms; waited += 20) {
    int status = 0;
    if (waitpid(pid, &status, WNOHANG) == pid) {
      return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    }
    usleep(20 * 1000);
  }
  return -1;
}

}  // namespace

ServerProcess::ServerProcess(const std::string& args) {
  int fds[2];
  if (pipe(fds) != 0) return;
  const std::string cmd =
      "exec " + BinaryDir() + "/kvllm serve --host 127.0.0.1 --port 0 " + args;
  pid_ = fork();
  if (pid_ == 0) {
    dup2(fds[1], STDERR_FILENO);
    close(fds[0]);
    close(fds[1]);
    execl("/bin/sh", "sh", "-c", cmd.c_str(), static_cast<char*>(nullptr));
    _exit(127);
  }
  close(fds[1]);
  fd_ = fds[0];
  // Read until the server says where it listens, then keep draining its stderr in the
  // background so that it never blocks on a full pipe.
  const std::regex listening(R"(listening on http://127\.0\.0\.1:(\d+))");
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  std::string text;
  while (port_ == 0 && std::chrono::steady_clock::now() < deadline) {
    pollfd p{fd_, POLLIN, 0};
    if (poll(&p, 1, 200) <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n <= 0) break;  // exited
    text.append(buf, n);
    std::smatch m;
    if (std::regex_search(text, m, listening)) port_ = std::stoi(m[1]);
  }
  {
    std::lock_guard lock(mu_);
    log_ = text;
  }
  reader_ = std::thread([this] {
    char buf[4096];
    ssize_t n;
    while ((n = read(fd_, buf, sizeof buf)) > 0) {
      std::lock_guard lock(mu_);
      log_.append(buf, n);
    }
  });
}

ServerProcess::~ServerProcess() {
  if (pid_ > 0 && Stop() < 0) {
    kill(pid_, SIGKILL);
    WaitExit(pid_, 5000);
  }
  if (reader_.joinable()) reader_.join();
  if (fd_ >= 0) close(fd_);
}

int ServerProcess::Stop() {
  if (pid_ <= 0) return -1;
  kill(pid_, SIGTERM);
  const int status = WaitExit(pid_, 10000);
  if (status >= 0) {
    pid_ = -1;
    if (reader_.joinable()) reader_.join();  // the pipe is at its end: the whole log is in
  } else {
    // Where did it stop? The server logs each stage of its shutdown.
    std::fprintf(stderr, "server %d still running 10 s after SIGTERM; its log:\n%s\n", pid_,
                 log().c_str());
  }
  return status;
}

void ServerProcess::Crash() {
  if (pid_ <= 0) return;
  kill(pid_, SIGKILL);
  WaitExit(pid_, 10000);
  pid_ = -1;
}

std::string ServerProcess::log() const {
  std::lock_guard lock(mu_);
  return log_;
}

}  // namespace kvllm::testing
