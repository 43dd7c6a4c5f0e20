// The vocabulary a Tokenizer is built from, as GGUF stores it (tokenizer.ggml.*), independent
// of the file so that tests can build one by hand.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/pre_tokenizer.h"

namespace kvllm {

using TokenId = int32_t;
inline constexpr TokenId kNoToken = -1;

// Token types as stored in tokenizer.ggml.token_type.
enum class TokenType : int32_t {
  kUndefined = 0, kNormal = 1, kUnknown = 2, kControl = 3, kUserDefined = 4, kUnused = 5,
  kByte = 6,
};

enum class TokenizerKind {
  // SentencePiece (tokenizer.ggml.model "llama"): pieces merged by score, '▁' (U+2581) for
  // spaces, a space added before the text, bytes without a piece as <0xNN> tokens.
  kSpm,
  // BPE (tokenizer.ggml.model "gpt2", or "gemma4" with PreTokenizer::kNewlines): the text is
  // pre-tokenized into words, each word merged by the rank of its merges. Byte-level (GPT-2's
  // byte-to-unicode encoding) except for kNewlines, which merges raw UTF-8 with '▁' for
  // spaces and falls back to <0xNN> tokens.
  kBpe,
};

struct Vocab {
  TokenizerKind kind = TokenizerKind::kSpm;
  std::vector<std::string> pieces;
  std::vector<float> scores;       // SPM merge priorities; empty: all 0
  std::vector<TokenType> types;    // empty: all kNormal
  std::vector<std::string> merges;  // BPE: "left right", highest priority first
  PreTokenizer pre = PreTokenizer::kGpt2;  // BPE only
  TokenId bos = 1, eos = 2, unk = 0;       // kNoToken: the vocabulary has none
  // Tokens besides eos that end generation (end of turn, end of message).
  std::vector<TokenId> eog;
  bool add_bos = true, add_eos = false;
  bool add_space_prefix = true;  // SPM: a space before the text (and after special tokens)
  bool ignore_merges = false;    // BPE: a word that is a token as a whole is not merged
};

// Whether tokens are spelled with GPT-2's byte-to-unicode characters (byte_encoding.h).
inline bool IsByteLevel(const Vocab& vocab) {
  return vocab.kind == TokenizerKind::kBpe && vocab.pre != PreTokenizer::kNewlines;
}

// Whether text may produce a token of this type. Control tokens (<s>, <|im_start|>) come
// from add_special or parse_special, byte tokens from the fallback, and unknown or unused ones
// from nowhere.
bool IsTextPiece(TokenType type);

// Parses a byte token's text "<0xNN>" (either hex case); -1 when `piece` is not of that form.
int ParseByteToken(std::string_view piece);

}  // namespace kvllm
