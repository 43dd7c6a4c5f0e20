// Pre-tokenization for BPE vocabularies: the text is cut into words and merges never cross a
// word boundary. Each kind reproduces the split regexes llama.cpp uses for that family of
// models (from the models' tokenizer.json), hand-coded over code points because the regexes
// need Unicode categories (\p{L}, \p{N}, \p{P}) and lookahead. A kind with several regexes
// applies them in turn, each to every piece the previous ones left, keeping both what it
// matches and the text between matches (as llama.cpp's unicode_regex_split does).
#pragma once

#include <string_view>
#include <vector>

namespace kvllm {

enum class PreTokenizer {
  // Pieces of punctuation, then GPT-2's regex, then runs of numbers, then ASCII digit triples:
  // llama.cpp's choice for vocabularies converted before tokenizer.ggml.pre existed.
  kDefault,
  // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  kGpt2,
  // (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*
  // |\s*[\r\n]+|\s+(?!\S)|\s+
  kLlama3,
  // kLlama3 with single digits: \p{N} instead of \p{N}{1,3}.
  kQwen2,
  // kQwen2 with marks joining letters: [\p{L}\p{M}]+ and [^\s\p{L}\p{M}\p{N}]+.
  kQwen35,
  // Every number character alone (\p{N}), then GPT-2's regex.
  kStarCoder,
  // [\p{P}$+<=>^~|`]+, then GPT-2's regex, then [0-9][0-9][0-9].
  kFalcon,
  // [\r\n], \s?<cased letter>+, \s?<ASCII or full-width punctuation>+, \s+$, CJK runs, \p{N}+.
  kDeepSeekLlm,
  // [\r\n], \s?\p{L}+, \s?\p{P}+, CJK runs, \p{N}.
  kDeepSeekCoder,
  //  ?[^(\s|.,!?…。，、।۔،)]+
  kBloom,
  // Runs of newlines and runs of anything else ([^\n]+|[\n]+): Gemma 4, whose text has its
  // spaces replaced by U+2581 and is merged as raw UTF-8.
  kNewlines,
};

// Splits `text` into words: views into `text`, in order, whose concatenation is `text`.
// Bytes that are not valid UTF-8 count as one character each, classed as U+FFFD would be.
std::vector<std::string_view> PreTokenize(PreTokenizer kind, std::string_view text);

}  // namespace kvllm
