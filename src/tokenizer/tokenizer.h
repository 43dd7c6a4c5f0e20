// Tokenizer: text <-> token ids from a GGUF vocabulary. This module implements the
// SentencePiece-style model (`tokenizer.ggml.model` = "llama"): pieces with scores and types,
// '▁' (U+2581) for spaces, a leading space added to the text, byte fallback tokens <0xNN>,
// and BOS/EOS handling, matching llama.cpp's "spm" tokenizer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"

namespace kvllm {

using TokenId = int32_t;

// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

// The vocabulary as stored in GGUF, independent of the file (tests build one by hand).
struct SpmVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;      // empty: all 0
  std::vector<TokenType> types;   // empty: all kNormal
  TokenId bos = 1, eos = 2, unk = 0;
  bool add_bos = true, add_eos = false, add_space_prefix = true;
};

class Tokenizer {
 public:
  // Validates the vocabulary (sizes agree, special ids in range, unique pieces).
  static StatusOr<Tokenizer> FromVocab(SpmVocab vocab);
  // Reads tokenizer.ggml.{model,tokens,scores,token_type,bos_token_id,eos_token_id,
  // unknown_token_id,add_bos_token,add_eos_token,add_space_prefix}.
  static StatusOr<Tokenizer> FromGguf(const gguf::GgufFile& file);

  // Text to ids; `add_special` adds BOS/EOS as the vocabulary asks (add_bos / add_eos).
  std::vector<TokenId> Encode(std::string_view text, bool add_special) const;
  // The bytes of one token as it appears in text (control tokens and out-of-range ids give "",
  // byte tokens their byte, unknown tokens their text such as "<unk>" so that lost input stays
  // visible, '▁' becomes ' '). Bytes of a multi-byte UTF-8 character may be split across tokens.
  std::string TokenToPiece(TokenId id) const;
  // Ids to text; a leading space from the added prefix is removed when `strip_leading_space`
  // (only if the vocabulary adds that prefix: otherwise a leading space is the text's own).
  std::string Decode(const std::vector<TokenId>& ids, bool strip_leading_space = true) const;

  int32_t vocab_size() const { return static_cast<int32_t>(pieces_.size()); }
  TokenId bos() const { return bos_; }
  TokenId eos() const { return eos_; }
  bool add_bos() const { return add_bos_; }
  bool IsControl(TokenId id) const;
  bool IsEog(TokenId id) const { return id == eos_; }  // end of generation

 private:
  std::vector<std::string> pieces_;
  std::vector<float> scores_;
  std::vector<TokenType> types_;
  // Transparent so that Encode can look up string_views without building strings.
  struct PieceHash {
    using is_transparent = void;
    size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
  };
  // Only pieces that text may produce (not control, unknown, unused or byte tokens).
  std::unordered_map<std::string, TokenId, PieceHash, std::equal_to<>> piece_to_id_;
  TokenId byte_tokens_[256];  // -1 where the vocabulary has no <0xNN> token
  TokenId bos_ = 1, eos_ = 2, unk_ = 0;
  bool add_bos_ = true, add_eos_ = false, add_space_prefix_ = true;
};

// How the UTF-8 sequence at the start of `bytes` reads (strict: no overlongs, surrogates or
// code points above U+10FFFF). kInvalid: `length` bytes (at least 1) form the maximal prefix
// that can never complete and should become one U+FFFD. kIncomplete: all of `bytes` is a valid
// but unfinished character. Shared by Encode and Utf8Streamer so both split text alike.
struct Utf8Scan {
  enum Kind { kValid, kInvalid, kIncomplete } kind;
  size_t length;
};
Utf8Scan ScanUtf8(std::string_view bytes);

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
