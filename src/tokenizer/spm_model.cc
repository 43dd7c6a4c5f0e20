#include "tokenizer/spm_model.h"

#include <algorithm>
#include <cstdint>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/utf8.h"

namespace kvllm {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// A run of bytes of the normalized text in the doubly linked list Encode merges in place.
// A symbol merged into its left neighbour keeps length 0 and drops out of the list.
struct Symbol {
  size_t start;
  size_t length;
  int prev;
  int next;
};

// A candidate merge of `left` and its right neighbour. `length` is their combined length when
// the candidate was made; if either side has merged since, the lengths no longer add up and
// the candidate is stale (lengths only grow, so this check is exact).
struct Bigram {
  float score;
  int left;
  int right;
  size_t length;
};

// Highest score first; among equal scores the leftmost pair, as SentencePiece does.
struct BigramOrder {
  bool operator()(const Bigram& a, const Bigram& b) const {
    if (a.score != b.score) return a.score < b.score;
    return a.left > b.left;
  }
};

}  // namespace

SpmModel::SpmModel(const Vocab& vocab, const ByteTokens& byte_tokens)
    : piece_to_id_(MakeTextPieceMap(vocab)),
      scores_(vocab.scores),
      byte_tokens_(byte_tokens),
      unk_(vocab.unk),
      add_space_prefix_(vocab.add_space_prefix) {}

void SpmModel::Encode(std::string_view text, bool starts_text, std::vector<TokenId>* ids) const {
  std::string normalized;
  normalized.reserve(text.size() + kSpaceMarker.size());
  if (add_space_prefix_ && starts_text) normalized.append(kSpaceMarker);
  for (char c : text) {
    if (c == ' ') {
      normalized.append(kSpaceMarker);
    } else {
      normalized.push_back(c);
    }
  }
  const std::string_view norm = normalized;

  // One symbol per UTF-8 character; a byte that is not part of a valid character stands
  // alone so that byte fallback can still represent it.
  std::vector<Symbol> symbols;
  symbols.reserve(norm.size());
  for (size_t pos = 0; pos < norm.size();) {
    const Utf8Scan scan = ScanUtf8(norm.substr(pos));
    const size_t length = scan.kind == Utf8Scan::kValid ? scan.length : 1;
    const int index = static_cast<int>(symbols.size());
    symbols.push_back({pos, length, index - 1, index + 1});
    pos += length;
  }
  symbols.back().next = -1;

  std::priority_queue<Bigram, std::vector<Bigram>, BigramOrder> queue;
  auto try_add_bigram = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const Symbol& l = symbols[left];
    const Symbol& r = symbols[right];
    const auto it = piece_to_id_.find(norm.substr(l.start, l.length + r.length));
    if (it == piece_to_id_.end()) return;
    queue.push({scores_[it->second], left, right, l.length + r.length});
  };
  for (size_t i = 1; i < symbols.size(); ++i) {
    try_add_bigram(static_cast<int>(i) - 1, static_cast<int>(i));
  }

  while (!queue.empty()) {
    const Bigram bigram = queue.top();
    queue.pop();
    Symbol& left = symbols[bigram.left];
    Symbol& right = symbols[bigram.right];
    if (left.length == 0 || right.length == 0 ||
        left.length + right.length != bigram.length) {
      continue;
    }
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) symbols[right.next].prev = bigram.left;
    try_add_bigram(left.prev, bigram.left);
    try_add_bigram(bigram.left, left.next);
  }

  for (int i = 0; i >= 0; i = symbols[i].next) {
    const std::string_view piece = norm.substr(symbols[i].start, symbols[i].length);
    const auto it = piece_to_id_.find(piece);
    if (it != piece_to_id_.end()) {
      ids->push_back(it->second);
      continue;
    }
    // Only unmerged characters can miss the vocabulary (merges only form known pieces).
    // Without a byte token for every byte the character is lost as a whole: one unknown
    // token, as SentencePiece emits without byte fallback (nothing when there is none).
    const bool has_bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
      return byte_tokens_[static_cast<uint8_t>(c)] != kNoToken;
    });
    if (has_bytes) {
      for (char c : piece) ids->push_back(byte_tokens_[static_cast<uint8_t>(c)]);
    } else if (unk_ != kNoToken) {
      ids->push_back(unk_);
    }
  }
}

}  // namespace kvllm
