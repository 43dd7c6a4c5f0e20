// Finding special tokens written out in text (chat markup such as "<|im_start|>", or the
// whitespace tokens GPT-NeoX vocabularies add), which are matched verbatim before the text is
// tokenized, as llama.cpp and Hugging Face tokenizers do.
#pragma once

#include <array>
#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "tokenizer/vocab.h"

namespace kvllm {

class SpecialTokenMatcher {
 public:
  struct Match {
    TokenId id = kNoToken;
    size_t length = 0;  // 0: no match
  };

  SpecialTokenMatcher() = default;
  // `tokens`: (text, id) pairs with non-empty, distinct texts.
  explicit SpecialTokenMatcher(std::vector<std::pair<std::string, TokenId>> tokens);

  bool empty() const { return empty_; }
  // The longest token whose text starts `text`.
  Match MatchPrefix(std::string_view text) const;

 private:
  // By first byte, longest text first.
  std::array<std::vector<std::pair<std::string, TokenId>>, 256> by_first_byte_;
  bool empty_ = true;
};

}  // namespace kvllm
