// BPE by merge rank, as llama.cpp's "bpe" tokenizer runs it. The text is pre-tokenized into
// words (pre_tokenizer.h); each word starts as one symbol per byte (byte-level vocabularies,
// whose tokens spell bytes with GPT-2's byte-to-unicode characters) or per UTF-8 character,
// and the adjacent pair with the lowest-ranked merge in tokenizer.ggml.merges merges first
// (the leftmost among equals) until no merge applies. With ignore_merges (Llama 3) a word
// that is a token as a whole is that token.
#pragma once

#include <cstdint>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/subword_model.h"
#include "tokenizer/vocab.h"

namespace kvllm {

class BpeModel final : public SubwordModel {
 public:
  // Merges are read as "left right" (split at the first space after the first byte, so a
  // side may itself be a space); a merge whose sides or concatenation are not text pieces
  // can never apply and is left out.
  BpeModel(const Vocab& vocab, const ByteTokens& byte_tokens);

  void Encode(std::string_view text, bool starts_text,
              std::vector<TokenId>* ids) const override;

 private:
  struct Merge {
    int32_t rank;
    TokenId result;
  };
  // One symbol of the word being merged, in a doubly linked list; merged-away symbols keep
  // length 0.
  struct Symbol {
    TokenId id;  // kNoToken: a character the vocabulary lacks
    uint32_t start, length;
    int prev, next;
  };
  static uint64_t PairKey(TokenId left, TokenId right) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) |
           static_cast<uint32_t>(right);
  }

  // Appends the ids of one pre-tokenized word (byte-encoded when byte_level_).
  void EncodeWord(std::string_view word, std::vector<Symbol>* symbols,
                  std::vector<TokenId>* ids) const;

  PieceMap piece_to_id_;
  std::unordered_map<uint64_t, Merge> merges_;
  ByteTokens byte_tokens_{};       // the <0xNN> fallback when not byte_level_
  ByteTokens byte_char_tokens_{};  // byte_level_: the token of each byte's character
  PreTokenizer pre_ = PreTokenizer::kGpt2;
  bool byte_level_ = true;
  bool ignore_merges_ = false;
};

}  // namespace kvllm
