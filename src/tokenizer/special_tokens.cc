#include "tokenizer/special_tokens.h"

#include <algorithm>
#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvllm {

SpecialTokenMatcher::SpecialTokenMatcher(std::vector<std::pair<std::string, TokenId>> tokens)
    : empty_(tokens.empty()) {
  for (auto& token : tokens) {
    by_first_byte_[static_cast<uint8_t>(token.first[0])].push_back(std::move(token));
  }
  for (auto& bucket : by_first_byte_) {
    std::sort(bucket.begin(), bucket.end(), [](const auto& a, const auto& b) {
      return a.first.size() > b.first.size();
    });
  }
}

SpecialTokenMatcher::Match SpecialTokenMatcher::MatchPrefix(std::string_view text) const {
  if (text.empty()) return {};
  for (const auto& [token, id] : by_first_byte_[static_cast<uint8_t>(text[0])]) {
    if (text.starts_with(token)) return {id, token.size()};
  }
  return {};
}

}  // namespace kvllm
