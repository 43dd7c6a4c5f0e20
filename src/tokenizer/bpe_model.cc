#include "tokenizer/bpe_model.h"

#include <cstdint>
#include <queue>
#include <string>
#include <string_view>
#include <vector>

#include "tokenizer/byte_encoding.h"
#include "tokenizer/utf8.h"

namespace kvllm {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

// A merge that applied to two neighbours when it was queued; stale once either has changed.
struct Candidate {
  int32_t rank;
  int left, right;
  TokenId left_id, right_id, result;
};

// Lowest rank first; among equal ranks the leftmost pair.
struct CandidateOrder {
  bool operator()(const Candidate& a, const Candidate& b) const {
    if (a.rank != b.rank) return a.rank > b.rank;
    return a.left > b.left;
  }
};

TokenId Find(const PieceMap& map, std::string_view piece) {
  const auto it = map.find(piece);
  return it == map.end() ? kNoToken : it->second;
}

}  // namespace

BpeModel::BpeModel(const Vocab& vocab, const ByteTokens& byte_tokens)
    : piece_to_id_(MakeTextPieceMap(vocab)),
      byte_tokens_(byte_tokens),
      pre_(vocab.pre),
      byte_level_(IsByteLevel(vocab)),
      ignore_merges_(vocab.ignore_merges) {
  merges_.reserve(vocab.merges.size());
  for (size_t rank = 0; rank < vocab.merges.size(); ++rank) {
    const std::string_view merge = vocab.merges[rank];
    const size_t space = merge.find(' ', 1);
    if (space == std::string_view::npos) continue;
    const std::string_view left = merge.substr(0, space);
    const std::string_view right = merge.substr(space + 1);
    const TokenId left_id = Find(piece_to_id_, left);
    const TokenId right_id = Find(piece_to_id_, right);
    const TokenId result = Find(piece_to_id_, std::string(left).append(right));
    if (left_id == kNoToken || right_id == kNoToken || result == kNoToken) continue;
    // The first of duplicate merges keeps its rank.
    merges_.emplace(PairKey(left_id, right_id), Merge{static_cast<int32_t>(rank), result});
  }
  std::string encoded;
  for (int byte = 0; byte < 256; ++byte) {
    encoded.clear();
    AppendUtf8(ByteToCodePoint(static_cast<uint8_t>(byte)), &encoded);
    byte_char_tokens_[byte] = Find(piece_to_id_, encoded);
  }
}

void BpeModel::Encode(std::string_view text, bool /*starts_text*/,
                      std::vector<TokenId>* ids) const {
  std::string escaped;
  if (!byte_level_) {
    for (char c : text) {
      if (c == ' ') {
        escaped.append(kSpaceMarker);
      } else {
        escaped.push_back(c);
      }
    }
    text = escaped;
  }
  std::vector<Symbol> symbols;
  std::string encoded;
  for (std::string_view word : PreTokenize(pre_, text)) {
    // Gemma 4 has tokens for runs of newlines that no merge builds.
    const bool newlines = !byte_level_ && word.find_first_not_of('\n') == std::string_view::npos;
    if (ignore_merges_ || newlines) {
      std::string_view whole = word;
      if (byte_level_) {
        encoded.clear();
        AppendByteEncoded(word, &encoded);
        whole = encoded;
      }
      if (const TokenId id = Find(piece_to_id_, whole); id != kNoToken) {
        ids->push_back(id);
        continue;
      }
    }
    EncodeWord(word, &symbols, ids);
  }
}

void BpeModel::EncodeWord(std::string_view word, std::vector<Symbol>* symbols,
                          std::vector<TokenId>* ids) const {
  symbols->clear();
  for (size_t pos = 0; pos < word.size();) {
    size_t length = 1;
    TokenId id;
    if (byte_level_) {
      id = byte_char_tokens_[static_cast<uint8_t>(word[pos])];
    } else {
      const Utf8Scan scan = ScanUtf8(word.substr(pos));
      if (scan.kind == Utf8Scan::kValid) length = scan.length;
      id = Find(piece_to_id_, word.substr(pos, length));
    }
    const int index = static_cast<int>(symbols->size());
    symbols->push_back({id, static_cast<uint32_t>(pos), static_cast<uint32_t>(length),
                        index - 1, index + 1});
    pos += length;
  }
  symbols->back().next = -1;

  std::vector<Symbol>& sym = *symbols;
  std::priority_queue<Candidate, std::vector<Candidate>, CandidateOrder> queue;
  auto try_add = [&](int left, int right) {
    if (left < 0 || right < 0) return;
    const TokenId left_id = sym[left].id;
    const TokenId right_id = sym[right].id;
    if (left_id == kNoToken || right_id == kNoToken) return;
    const auto it = merges_.find(PairKey(left_id, right_id));
    if (it == merges_.end()) return;
    queue.push({it->second.rank, left, right, left_id, right_id, it->second.result});
  };
  for (size_t i = 1; i < sym.size(); ++i) try_add(static_cast<int>(i) - 1, static_cast<int>(i));

  while (!queue.empty()) {
    const Candidate c = queue.top();
    queue.pop();
    Symbol& left = sym[c.left];
    Symbol& right = sym[c.right];
    // A symbol only changes by growing (so its id changes) or by being merged away.
    if (left.length == 0 || right.length == 0 || left.next != c.right || left.id != c.left_id ||
        right.id != c.right_id) {
      continue;
    }
    left.id = c.result;
    left.length += right.length;
    right.length = 0;
    left.next = right.next;
    if (right.next >= 0) sym[right.next].prev = c.left;
    try_add(left.prev, c.left);
    try_add(c.left, left.next);
  }

  for (int i = 0; i >= 0; i = sym[i].next) {
    if (sym[i].id != kNoToken) {
      ids->push_back(sym[i].id);
      continue;
    }
    // A character the vocabulary lacks: its <0xNN> tokens where it has them. A byte-level
    // vocabulary lacking a byte's character has no way to spell it; like llama.cpp, the byte
    // is dropped.
    if (byte_level_) continue;
    for (char c : word.substr(sym[i].start, sym[i].length)) {
      const TokenId byte = byte_tokens_[static_cast<uint8_t>(c)];
      if (byte != kNoToken) ids->push_back(byte);
    }
  }
}

}  // namespace kvllm
