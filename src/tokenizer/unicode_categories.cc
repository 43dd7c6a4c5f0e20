#include "tokenizer/unicode_categories.h"

#include <algorithm>
#include <cstdint>
#include <iterator>

namespace kvllm {
namespace {

// Flags hold from `first` up to the next range's first code point.
struct Range {
  uint32_t first;
  uint8_t flags;  // UnicodeCategory | kWhitespaceFlag
};

constexpr uint8_t kCategoryMask = 0x7;
constexpr uint8_t kWhitespaceFlag = 0x8;

constexpr Range kRanges[] = {
#include "tokenizer/unicode_category_ranges.inc"
};

}  // namespace

CodePointClass ClassifyCodePoint(char32_t cp) {
  if (cp > 0x10FFFF) return {};
  // The last range starting at or before cp; the table starts at U+0000, so there is one.
  const Range* it = std::upper_bound(std::begin(kRanges), std::end(kRanges), cp,
                                     [](char32_t c, const Range& r) { return c < r.first; });
  const uint8_t flags = std::prev(it)->flags;
  return {static_cast<UnicodeCategory>(flags & kCategoryMask), (flags & kWhitespaceFlag) != 0};
}

}  // namespace kvllm
