// What the fuzz targets share: a check that reports and aborts (libFuzzer then saves the input
// as a crash), an independent strict UTF-8 validator, and a file holding the current input for
// readers that only take a path.
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>

// Unlike KVLLM_CHECK this prints a message built at the failure.
#define FUZZ_CHECK(cond, message)                                                         \
  do {                                                                                    \
    if (!(cond)) {                                                                        \
      std::fprintf(stderr, "%s:%d: FUZZ_CHECK(%s) failed: %s\n", __FILE__, __LINE__, #cond, \
                   std::string(message).c_str());                                         \
      __builtin_trap();                                                                   \
    }                                                                                     \
  } while (0)

namespace kvllm::fuzz {

// Strict UTF-8 (RFC 3629: no overlongs, no surrogates, nothing above U+10FFFF), written
// without the tokenizer's own scanner so that it can judge it.
inline bool IsValidUtf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto b0 = static_cast<uint8_t>(s[i]);
    size_t n = 0;
    uint8_t lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (b0 < 0x80) {
      ++i;
      continue;
    } else if (b0 >= 0xC2 && b0 <= 0xDF) {
      n = 1;
    } else if (b0 >= 0xE0 && b0 <= 0xEF) {
      n = 2;
      if (b0 == 0xE0) lo = 0xA0;
      if (b0 == 0xED) hi = 0x9F;
    } else if (b0 >= 0xF0 && b0 <= 0xF4) {
      n = 3;
      if (b0 == 0xF0) lo = 0x90;
      if (b0 == 0xF4) hi = 0x8F;
    } else {
      return false;
    }
    if (s.size() - i <= n) return false;
    for (size_t k = 1; k <= n; ++k) {
      const auto b = static_cast<uint8_t>(s[i + k]);
      if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return false;
    }
    i += n + 1;
  }
  return true;
}

// An anonymous in-memory file (memfd) whose path, /proc/self/fd/N, opens the current input.
class InputFile {
 public:
  InputFile() : fd_(memfd_create("kvllm-fuzz-input", 0)) {
    FUZZ_CHECK(fd_ >= 0, "memfd_create failed");
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  // Replaces the file's contents with `data`.
  const std::string& Write(const uint8_t* data, size_t size) {
    FUZZ_CHECK(ftruncate(fd_, 0) == 0, "ftruncate failed");
    size_t done = 0;
    while (done < size) {
      const ssize_t n = pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      FUZZ_CHECK(n > 0, "pwrite failed");
      done += static_cast<size_t>(n);
    }
    return path_;
  }

 private:
  int fd_;
  std::string path_;
};

}  // namespace kvllm::fuzz
