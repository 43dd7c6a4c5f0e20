#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "tokenizer/bpe_model.h"
#include "tokenizer/byte_encoding.h"
#include "tokenizer/spm_model.h"
#include "tokenizer/subword_model.h"
#include "tokenizer/vocab_gguf.h"

namespace kvllm {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

std::string UnescapeSpaces(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  for (size_t pos = 0; pos < piece.size();) {
    if (piece.substr(pos, kSpaceMarker.size()) == kSpaceMarker) {
      out.push_back(' ');
      pos += kSpaceMarker.size();
    } else {
      out.push_back(piece[pos++]);
    }
  }
  return out;
}

// What TokenToPiece shows for one token.
std::string TokenText(const Vocab& vocab, size_t id) {
  const std::string& piece = vocab.pieces[id];
  switch (vocab.types[id]) {
    case TokenType::kControl:
    case TokenType::kUnused:
      return {};
    case TokenType::kByte:
      return std::string(1, static_cast<char>(ParseByteToken(piece)));
    case TokenType::kUnknown:
    case TokenType::kUserDefined:
      // Added to the vocabulary as raw text, not in the model's spelling.
      return piece;
    case TokenType::kNormal:
    case TokenType::kUndefined:
      break;
  }
  return IsByteLevel(vocab) ? DecodeByteEncoded(piece) : UnescapeSpaces(piece);
}

Status CheckSpecialId(const char* name, TokenId id, size_t n) {
  if (id == kNoToken || (id >= 0 && static_cast<size_t>(id) < n)) return Status::Ok();
  return Status::Error(std::string("vocabulary: ") + name + " token id " + std::to_string(id) +
                       " is out of range for " + std::to_string(n) + " tokens");
}

// Checks what the models rely on and fills in default scores and types. Returns the byte
// tokens found.
StatusOr<ByteTokens> CheckVocab(Vocab& vocab) {
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
  vocab.scores.resize(n, 0.0f);
  vocab.types.resize(n, TokenType::kNormal);

  KVLLM_RETURN_IF_ERROR(CheckSpecialId("bos", vocab.bos, n));
  KVLLM_RETURN_IF_ERROR(CheckSpecialId("eos", vocab.eos, n));
  KVLLM_RETURN_IF_ERROR(CheckSpecialId("unknown", vocab.unk, n));
  for (TokenId id : vocab.eog) KVLLM_RETURN_IF_ERROR(CheckSpecialId("end-of-generation", id, n));
  if (vocab.add_bos && vocab.bos == kNoToken) {
    return Status::Error("vocabulary: adds a bos token but has none");
  }
  if (vocab.add_eos && vocab.eos == kNoToken) {
    return Status::Error("vocabulary: adds an eos token but has none");
  }

  ByteTokens byte_tokens;
  byte_tokens.fill(kNoToken);
  // Every piece goes into `seen` so duplicates are caught whatever their type.
  std::unordered_map<std::string_view, size_t> seen;
  seen.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const std::string& piece = vocab.pieces[i];
    const TokenType type = vocab.types[i];
    if (static_cast<int32_t>(type) < 0 || type > TokenType::kByte) {
      return Status::Error("vocabulary: token " + std::to_string(i) + " has unknown type " +
                           std::to_string(static_cast<int32_t>(type)));
    }
    const auto [it, inserted] = seen.emplace(piece, i);
    if (!inserted) {
      return Status::Error("vocabulary: tokens " + std::to_string(it->second) + " and " +
                           std::to_string(i) + " are both \"" + piece + "\"");
    }
    if (type != TokenType::kByte) continue;
    const int byte = ParseByteToken(piece);
    if (byte < 0) {
      return Status::Error("vocabulary: byte token " + std::to_string(i) + " is \"" + piece +
                           "\", not <0xNN>");
    }
    if (byte_tokens[byte] != kNoToken) {
      return Status::Error("vocabulary: tokens " + std::to_string(byte_tokens[byte]) + " and " +
                           std::to_string(i) + " are both byte " + piece);
    }
    byte_tokens[byte] = static_cast<TokenId>(i);
  }
  return byte_tokens;
}

}  // namespace

StatusOr<Tokenizer> Tokenizer::FromVocab(Vocab vocab) {
  KVLLM_ASSIGN_OR_RETURN(const ByteTokens byte_tokens, CheckVocab(vocab));
  const size_t n = vocab.pieces.size();

  Tokenizer tok;
  if (vocab.kind == TokenizerKind::kSpm) {
    tok.model_ = std::make_shared<SpmModel>(vocab, byte_tokens);
  } else {
    tok.model_ = std::make_shared<BpeModel>(vocab, byte_tokens);
  }
  tok.texts_.reserve(n);
  std::vector<std::pair<std::string, TokenId>> user_defined, special;
  for (size_t i = 0; i < n; ++i) {
    tok.texts_.push_back(TokenText(vocab, i));
    const TokenType type = vocab.types[i];
    const std::string& piece = vocab.pieces[i];
    if (piece.empty()) continue;
    const auto id = static_cast<TokenId>(i);
    if (type == TokenType::kUserDefined) user_defined.emplace_back(piece, id);
    if (type == TokenType::kUserDefined || type == TokenType::kControl ||
        type == TokenType::kUnknown) {
      special.emplace_back(piece, id);
    }
  }
  tok.user_defined_ = SpecialTokenMatcher(std::move(user_defined));
  tok.special_ = SpecialTokenMatcher(std::move(special));
  tok.types_ = std::move(vocab.types);
  tok.eog_ = std::move(vocab.eog);
  tok.bos_ = vocab.bos;
  tok.eos_ = vocab.eos;
  tok.add_bos_ = vocab.add_bos;
  tok.add_eos_ = vocab.add_eos;
  tok.add_space_prefix_ = vocab.kind == TokenizerKind::kSpm && vocab.add_space_prefix;
  return tok;
}

StatusOr<Tokenizer> Tokenizer::FromGguf(const gguf::GgufFile& file) {
  KVLLM_ASSIGN_OR_RETURN(Vocab vocab, ReadVocabFromGguf(file));
  StatusOr<Tokenizer> tok = FromVocab(std::move(vocab));
  if (!tok.ok()) return Status::Error("tokenizer.ggml.tokens: " + tok.status().message());
  return tok;
}

std::vector<TokenId> Tokenizer::Encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<TokenId> ids;
  if (add_special && add_bos_) ids.push_back(bos_);

  // Text between special tokens goes to the model piece by piece.
  const SpecialTokenMatcher& specials = parse_special ? special_ : user_defined_;
  size_t start = 0;
  bool starts_text = true;
  for (size_t pos = 0; pos < text.size() && !specials.empty();) {
    const SpecialTokenMatcher::Match match = specials.MatchPrefix(text.substr(pos));
    if (match.length == 0) {
      ++pos;
      continue;
    }
    if (pos > start) model_->Encode(text.substr(start, pos - start), starts_text, &ids);
    ids.push_back(match.id);
    pos += match.length;
    start = pos;
    starts_text = true;
  }
  if (start < text.size()) model_->Encode(text.substr(start), starts_text, &ids);

  if (add_special && add_eos_) ids.push_back(eos_);
  return ids;
}

std::string Tokenizer::TokenToPiece(TokenId id) const {
  if (id < 0 || id >= vocab_size()) return {};
  return texts_[id];
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

bool Tokenizer::IsEog(TokenId id) const {
  if (id == kNoToken) return false;
  return id == eos_ || std::find(eog_.begin(), eog_.end(), id) != eog_.end();
}

std::vector<TokenId> Tokenizer::EogTokens() const {
  std::vector<TokenId> ids;
  for (TokenId id = 0; id < vocab_size(); ++id) {
    if (IsEog(id)) ids.push_back(id);
  }
  return ids;
}

}  // namespace kvllm
