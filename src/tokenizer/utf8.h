// UTF-8 helpers shared by the tokenizer models: strict scanning (what counts as one
// character), decoding and encoding code points, and streaming token bytes as valid text.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace kvllm {

// How the UTF-8 sequence at the start of `bytes` reads (strict: no overlongs, surrogates or
// code points above U+10FFFF). kInvalid: `length` bytes (at least 1) form the maximal prefix
// that can never complete and should become one U+FFFD. kIncomplete: all of `bytes` is a valid
// but unfinished character. Shared by Encode and Utf8Streamer so both split text alike.
struct Utf8Scan {
  enum Kind { kValid, kInvalid, kIncomplete } kind;
  size_t length;
};
Utf8Scan ScanUtf8(std::string_view bytes);

// The code point of the first `length` bytes of `bytes`, which ScanUtf8 found valid.
char32_t DecodeUtf8(std::string_view bytes, size_t length);

// Appends the UTF-8 encoding of `cp` (at most U+10FFFF).
void AppendUtf8(char32_t cp, std::string* out);

// Streams token pieces as valid UTF-8: bytes of an incomplete character are held back until
// the character is complete (or flushed as U+FFFD when it can never complete).
class Utf8Streamer {
 public:
  // Appends `piece` and returns the longest valid UTF-8 prefix not returned before.
  std::string Push(std::string_view piece);
  // Returns whatever is still held (invalid tails become U+FFFD).
  std::string Flush();

 private:
  std::string pending_;
};

}  // namespace kvllm
