#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <queue>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvllm {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581, SentencePiece's space

// Text may only produce pieces the model was trained to emit from text: control tokens
// (<s>, </s>) come from add_special, byte tokens from the fallback, and unknown/unused ones
// from nowhere.
bool IsTextPiece(TokenType type) {
  return type == TokenType::kNormal || type == TokenType::kUserDefined ||
         type == TokenType::kUndefined;
}

// Parses "<0xNN>" (either hex case); -1 when `piece` is not of that form.
int ParseByteToken(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

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

std::string ReplaceSpaces(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    if (c == ' ') {
      out.append(kSpaceMarker);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

bool IsSignedIntegerType(gguf::ValueType type) {
  using gguf::ValueType;
  return type == ValueType::kInt8 || type == ValueType::kInt16 || type == ValueType::kInt32 ||
         type == ValueType::kInt64;
}

bool IsUnsignedIntegerType(gguf::ValueType type) {
  using gguf::ValueType;
  return type == ValueType::kUint8 || type == ValueType::kUint16 ||
         type == ValueType::kUint32 || type == ValueType::kUint64;
}

// The array stored under `key`, or an error naming the key when it is absent (and required)
// or not an array. Returns nullptr for an absent optional key.
StatusOr<const gguf::Value*> FindArray(const gguf::GgufFile& file, std::string_view key,
                                        bool required) {
  const gguf::Value* value = file.Find(key);
  if (value == nullptr) {
    if (required) return Status::Error(std::string(key) + ": missing (required)");
    return static_cast<const gguf::Value*>(nullptr);
  }
  if (value->type != gguf::ValueType::kArray) {
    return Status::Error(std::string(key) + ": expected an array, found " +
                         gguf::ValueTypeName(value->type));
  }
  return value;
}

// Reads the u32 special token id under `key` and checks that it names a token.
StatusOr<TokenId> GetTokenId(const gguf::GgufFile& file, std::string_view key,
                             TokenId fallback, size_t n_tokens) {
  StatusOr<uint64_t> id = file.GetUint(key, static_cast<uint64_t>(fallback));
  if (!id.ok()) return id.status();
  if (*id >= n_tokens) {
    return Status::Error(std::string(key) + ": token id " + std::to_string(*id) +
                         " is out of range for a vocabulary of " + std::to_string(n_tokens) +
                         " tokens");
  }
  return static_cast<TokenId>(*id);
}

}  // namespace

StatusOr<Tokenizer> Tokenizer::FromVocab(SpmVocab vocab) {
  const size_t n = vocab.pieces.size();
  if (n == 0) return Status::Error("vocabulary: no tokens");
  if (n > static_cast<size_t>(INT32_MAX)) return Status::Error("vocabulary: too many tokens");
  if (!vocab.scores.empty() && vocab.scores.size() != n) {
    return Status::Error("vocabulary: " + std::to_string(vocab.scores.size()) + " scores for " +
                         std::to_string(n) + " tokens");
  }
  if (!vocab.types.empty() && vocab.types.size() != n) {
    return Status::Error("vocabulary: " + std::to_string(vocab.types.size()) +
                         " token types for " + std::to_string(n) + " tokens");
  }
  const std::pair<const char*, TokenId> special_ids[] = {
      {"bos", vocab.bos}, {"eos", vocab.eos}, {"unknown", vocab.unk}};
  for (const auto& [name, id] : special_ids) {
    if (id < 0 || static_cast<size_t>(id) >= n) {
      return Status::Error(std::string("vocabulary: ") + name + " token id " +
                           std::to_string(id) + " is out of range for " + std::to_string(n) +
                           " tokens");
    }
  }

  Tokenizer tok;
  tok.pieces_ = std::move(vocab.pieces);
  tok.scores_ = std::move(vocab.scores);
  tok.scores_.resize(n, 0.0f);
  tok.types_ = std::move(vocab.types);
  tok.types_.resize(n, TokenType::kNormal);
  tok.bos_ = vocab.bos;
  tok.eos_ = vocab.eos;
  tok.unk_ = vocab.unk;
  tok.add_bos_ = vocab.add_bos;
  tok.add_eos_ = vocab.add_eos;
  tok.add_space_prefix_ = vocab.add_space_prefix;
  std::fill(std::begin(tok.byte_tokens_), std::end(tok.byte_tokens_), -1);

  // Every piece goes into `seen` so duplicates are caught whatever their type.
  std::unordered_map<std::string_view, TokenId> seen;
  seen.reserve(n);
  tok.piece_to_id_.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const auto id = static_cast<TokenId>(i);
    const std::string& piece = tok.pieces_[i];
    const TokenType type = tok.types_[i];
    if (static_cast<int32_t>(type) < 0 || type > TokenType::kByte) {
      return Status::Error("vocabulary: token " + std::to_string(i) + " has unknown type " +
                           std::to_string(static_cast<int32_t>(type)));
    }
    const auto [it, inserted] = seen.emplace(piece, id);
    if (!inserted) {
      return Status::Error("vocabulary: tokens " + std::to_string(it->second) + " and " +
                           std::to_string(i) + " are both \"" + piece + "\"");
    }
    if (type == TokenType::kByte) {
      const int byte = ParseByteToken(piece);
      if (byte < 0) {
        return Status::Error("vocabulary: byte token " + std::to_string(i) + " is \"" + piece +
                             "\", not <0xNN>");
      }
      if (tok.byte_tokens_[byte] >= 0) {
        return Status::Error("vocabulary: tokens " + std::to_string(tok.byte_tokens_[byte]) +
                             " and " + std::to_string(i) + " are both byte " + piece);
      }
      tok.byte_tokens_[byte] = id;
    } else if (IsTextPiece(type) && !piece.empty()) {
      tok.piece_to_id_.emplace(piece, id);
    }
  }
  return tok;
}

StatusOr<Tokenizer> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  constexpr std::string_view kModelKey = "tokenizer.ggml.model";
  constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
  constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
  constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";

  StatusOr<std::string> model = file.GetString(kModelKey);
  if (!model.ok()) return model.status();
  if (*model != "llama") {
    return Status::Error(std::string(kModelKey) + " is \"" + *model +
                         "\": only \"llama\" (SentencePiece) vocabularies are supported for now");
  }

  SpmVocab vocab;
  StatusOr<const gguf::Value*> tokens = FindArray(file, kTokensKey, /*required=*/true);
  if (!tokens.ok()) return tokens.status();
  if ((*tokens)->elem_type != gguf::ValueType::kString) {
    return Status::Error(std::string(kTokensKey) + ": expected an array of strings, found " +
                         gguf::ValueTypeName((*tokens)->elem_type) + " elements");
  }
  const size_t n = (*tokens)->array.size();
  vocab.pieces.reserve(n);
  for (const gguf::Value& token : (*tokens)->array) vocab.pieces.push_back(token.str);

  StatusOr<const gguf::Value*> scores = FindArray(file, kScoresKey, /*required=*/false);
  if (!scores.ok()) return scores.status();
  if (*scores != nullptr) {
    const gguf::Value& array = **scores;
    if (array.elem_type != gguf::ValueType::kFloat32 &&
        array.elem_type != gguf::ValueType::kFloat64) {
      return Status::Error(std::string(kScoresKey) + ": expected an array of floats, found " +
                           gguf::ValueTypeName(array.elem_type) + " elements");
    }
    if (array.array.size() != n) {
      return Status::Error(std::string(kScoresKey) + ": " + std::to_string(array.array.size()) +
                           " scores for " + std::to_string(n) + " tokens");
    }
    vocab.scores.reserve(n);
    for (const gguf::Value& score : array.array) {
      vocab.scores.push_back(static_cast<float>(score.f));
    }
  }

  StatusOr<const gguf::Value*> types = FindArray(file, kTypesKey, /*required=*/false);
  if (!types.ok()) return types.status();
  if (*types != nullptr) {
    const gguf::Value& array = **types;
    const bool is_signed = IsSignedIntegerType(array.elem_type);
    if (!is_signed && !IsUnsignedIntegerType(array.elem_type)) {
      return Status::Error(std::string(kTypesKey) + ": expected an array of integers, found " +
                           gguf::ValueTypeName(array.elem_type) + " elements");
    }
    if (array.array.size() != n) {
      return Status::Error(std::string(kTypesKey) + ": " + std::to_string(array.array.size()) +
                           " types for " + std::to_string(n) + " tokens");
    }
    vocab.types.reserve(n);
    for (size_t i = 0; i < n; ++i) {
      const gguf::Value& type = array.array[i];
      const int64_t value = is_signed ? type.i : static_cast<int64_t>(type.u);
      if (value < 0 || value > static_cast<int64_t>(TokenType::kByte)) {
        return Status::Error(std::string(kTypesKey) + ": token " + std::to_string(i) +
                             " has unknown type " + std::to_string(value));
      }
      vocab.types.push_back(static_cast<TokenType>(value));
    }
  }

  // Range-check the ids here too, so that a bad id is reported under its key.
  StatusOr<TokenId> bos = GetTokenId(file, "tokenizer.ggml.bos_token_id", 1, n);
  if (!bos.ok()) return bos.status();
  StatusOr<TokenId> eos = GetTokenId(file, "tokenizer.ggml.eos_token_id", 2, n);
  if (!eos.ok()) return eos.status();
  StatusOr<TokenId> unk = GetTokenId(file, "tokenizer.ggml.unknown_token_id", 0, n);
  if (!unk.ok()) return unk.status();
  vocab.bos = *bos;
  vocab.eos = *eos;
  vocab.unk = *unk;

  const std::pair<std::string_view, bool*> flags[] = {
      {"tokenizer.ggml.add_bos_token", &vocab.add_bos},
      {"tokenizer.ggml.add_eos_token", &vocab.add_eos},
      {"tokenizer.ggml.add_space_prefix", &vocab.add_space_prefix},
  };
  for (const auto& [key, flag] : flags) {
    StatusOr<bool> value = file.GetBool(key, *flag);
    if (!value.ok()) return value.status();
    *flag = *value;
  }

  StatusOr<Tokenizer> tok = FromVocab(std::move(vocab));
  if (!tok.ok()) return Status::Error(std::string(kTokensKey) + ": " + tok.status().message());
  return tok;
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_special) const {
  std::vector<TokenId> ids;
  if (add_special && add_bos_) ids.push_back(bos_);

  if (!text.empty()) {
    std::string normalized;
    if (add_space_prefix_) normalized.append(kSpaceMarker);
    normalized.append(ReplaceSpaces(text));
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
        ids.push_back(it->second);
        continue;
      }
      // Only unmerged characters can miss the vocabulary (merges only form known pieces).
      // Without a byte token for every byte the character is lost as a whole: one unknown
      // token, as SentencePiece emits without byte fallback.
      const bool has_bytes = std::all_of(piece.begin(), piece.end(), [&](char c) {
        return byte_tokens_[static_cast<uint8_t>(c)] >= 0;
      });
      if (!has_bytes) {
        ids.push_back(unk_);
        continue;
      }
      for (char c : piece) ids.push_back(byte_tokens_[static_cast<uint8_t>(c)]);
    }
  }

  if (add_special && add_eos_) ids.push_back(eos_);
  return ids;
}

std::string Tokenizer::TokenToPiece(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return {};
  const std::string& piece = pieces_[id];
  switch (types_[id]) {
    case TokenType::kControl:
      return {};
    case TokenType::kByte:
      return std::string(1, static_cast<char>(ParseByteToken(piece)));
    default:
      // Unknown tokens render as their text ("<unk>"), so lost input stays visible.
      break;
  }
  std::string out;
  out.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (std::string_view(piece).substr(pos, kSpaceMarker.size()) == kSpaceMarker) {
      out.push_back(' ');
      pos += kSpaceMarker.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

std::string Tokenizer::Decode(const std::vector<TokenId>& ids, bool strip_leading_space) const {
  std::string text;
  for (TokenId id : ids) text.append(TokenToPiece(id));
  // Only a prefix Encode added is stripped; without add_space_prefix a leading space is real.
  if (strip_leading_space && add_space_prefix_ && !text.empty() && text[0] == ' ') {
    text.erase(0, 1);
  }
  return text;
}

bool Tokenizer::IsControl(TokenId id) const {
  return id >= 0 && id < vocab_size() && types_[id] == TokenType::kControl;
}

}  // namespace kvllm
