// Tokenizer: text <-> token ids from a GGUF vocabulary, matching llama.cpp. Two models sit
// behind it (vocab.h): SentencePiece ("llama" vocabularies: SpmModel) and BPE ("gpt2" and
// "gemma4": BpeModel with a pre-tokenizer per model family). The Tokenizer itself cuts special
// tokens out of the text before the model sees it, adds BOS/EOS, and turns ids back into text.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "tokenizer/special_tokens.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab.h"

namespace kvllm {

class SubwordModel;

class Tokenizer {
 public:
  // Validates the vocabulary (sizes agree, special ids in range, unique pieces, well-formed
  // byte tokens).
  static StatusOr<Tokenizer> FromVocab(Vocab vocab);
  // Reads the vocabulary with ReadVocabFromGguf (vocab_gguf.h) and validates it.
  static StatusOr<Tokenizer> FromGguf(const gguf::GgufFile& file);

  // Text to ids; `add_special` adds BOS/EOS as the vocabulary asks (add_bos / add_eos).
  // User-defined tokens written out in the text are always matched verbatim, as llama.cpp
  // and Hugging Face tokenizers do; control tokens (<s>, <|im_start|>) and the unknown token
  // only with `parse_special`, for text such as a rendered chat template. Without it their
  // text is tokenized like any other, which is how llama.cpp's tokenizer tests run.
  std::vector<TokenId> Encode(std::string_view text, bool add_special,
                              bool parse_special = false) const;
  // The bytes of one token as it appears in text: control and unused tokens and out-of-range
  // ids give "", byte tokens their byte, unknown and user-defined tokens their text (so that
  // "<unk>" stays visible), SentencePiece's '▁' becomes ' ' and byte-level BPE characters
  // become their bytes. Bytes of a multi-byte UTF-8 character may be split across tokens.
  std::string TokenToPiece(TokenId id) const;
  // Ids to text; a leading space from the added prefix is removed when `strip_leading_space`
  // (only if the vocabulary adds that prefix: otherwise a leading space is the text's own).
  std::string Decode(const std::vector<TokenId>& ids, bool strip_leading_space = true) const;

  int32_t vocab_size() const { return static_cast<int32_t>(texts_.size()); }
  TokenId bos() const { return bos_; }  // kNoToken when the vocabulary has none
  TokenId eos() const { return eos_; }  // kNoToken when the vocabulary has none
  bool add_bos() const { return add_bos_; }
  bool IsControl(TokenId id) const;
  // End of generation: eos, and end-of-turn tokens (Vocab::eog).
  bool IsEog(TokenId id) const;
  // Every end-of-generation token: the stop tokens of a generation.
  std::vector<TokenId> EogTokens() const;

 private:
  // What TokenToPiece returns for each token.
  std::vector<std::string> texts_;
  std::vector<TokenType> types_;
  // Shared: the model is immutable, and a Tokenizer is cheap to copy.
  std::shared_ptr<const SubwordModel> model_;
  SpecialTokenMatcher user_defined_;  // matched in all text
  SpecialTokenMatcher special_;       // with parse_special: user-defined, control, unknown
  std::vector<TokenId> eog_;
  TokenId bos_ = kNoToken, eos_ = kNoToken;
  bool add_bos_ = false, add_eos_ = false, add_space_prefix_ = false;
};

}  // namespace kvllm
