// SentencePiece's BPE-by-score, as llama.cpp's "spm" tokenizer runs it: the text, with spaces
// as '▁' and a '▁' before it, starts as one symbol per UTF-8 character; the adjacent pair
// whose concatenation is the highest-scoring piece merges first (the leftmost among equals),
// until no pair forms a piece. Characters left without a piece become their bytes' <0xNN>
// tokens, or the unknown token when the vocabulary lacks one of those bytes.
#pragma once

#include <string_view>
#include <vector>

#include "tokenizer/subword_model.h"
#include "tokenizer/vocab.h"

namespace kvllm {

class SpmModel final : public SubwordModel {
 public:
  SpmModel(const Vocab& vocab, const ByteTokens& byte_tokens);
  void Encode(std::string_view text, bool starts_text,
              std::vector<TokenId>* ids) const override;

 private:
  PieceMap piece_to_id_;
  std::vector<float> scores_;
  ByteTokens byte_tokens_;
  TokenId unk_;
  bool add_space_prefix_;
};

}  // namespace kvllm
