// The interface between the Tokenizer and its models (SpmModel, BpeModel): turning plain text,
// with any special tokens already cut out, into token ids.
#pragma once

#include <array>
#include <cstddef>
#include <functional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "tokenizer/vocab.h"

namespace kvllm {

class SubwordModel {
 public:
  virtual ~SubwordModel() = default;
  // Appends the ids of `text`, a non-empty stretch between special tokens. `starts_text`: it
  // opens the input or follows a special token (where SentencePiece adds its space prefix).
  virtual void Encode(std::string_view text, bool starts_text,
                      std::vector<TokenId>* ids) const = 0;
};

// Transparent so that models can look up string_views without building strings.
struct PieceHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};
using PieceMap = std::unordered_map<std::string, TokenId, PieceHash, std::equal_to<>>;

// The <0xNN> token of each byte; kNoToken where the vocabulary has none.
using ByteTokens = std::array<TokenId, 256>;

// The pieces text may produce (IsTextPiece), by text. The models are built from a vocabulary
// that Tokenizer::FromVocab has checked and completed (a score and a type for every token).
PieceMap MakeTextPieceMap(const Vocab& vocab);

}  // namespace kvllm
