#include "tokenizer/pre_tokenizer.h"

#include <algorithm>
#include <cstddef>
#include <iterator>
#include <span>
#include <string_view>
#include <vector>

#include "tokenizer/unicode_categories.h"
#include "tokenizer/utf8.h"

namespace kvllm {
namespace {

constexpr char32_t kReplacementChar = 0xFFFD;

// One character of the text and where its bytes start.
struct Char {
  char32_t cp;
  CodePointClass cls;
  size_t offset;
};
using Chars = std::vector<Char>;

// The end of the match of one regex starting at `pos` inside the piece that ends at `end`,
// or `pos` when the regex does not match there. `end` bounds lookahead too: a regex sees
// each piece as the whole input, as llama.cpp runs it.
using Matcher = size_t (*)(const Chars& c, size_t pos, size_t end);
// Cuts the piece [begin, end) and appends the end of each resulting piece to `ends`.
using Splitter = void (*)(const Chars& c, size_t begin, size_t end, std::vector<size_t>* ends);
using CharPredicate = bool (*)(const Char& ch);

struct CodePointRange {
  char32_t first, last;
};

// The cased letters of DeepSeek LLM's tokenizer.json letter class.
constexpr CodePointRange kDeepSeekLetters[] = {
    {0x0041, 0x005A}, {0x0061, 0x007A}, {0x00B5, 0x00B5}, {0x00C0, 0x00D6}, {0x00D8, 0x00F6},
    {0x00F8, 0x01BA}, {0x01BC, 0x01BF}, {0x01C4, 0x0293}, {0x0295, 0x02AF}, {0x0370, 0x0373},
    {0x0376, 0x0377}, {0x037B, 0x037D}, {0x037F, 0x037F}, {0x0386, 0x0386}, {0x0388, 0x038A},
    {0x038C, 0x038C}, {0x038E, 0x03A1}, {0x03A3, 0x03F5}, {0x03F7, 0x0481}, {0x048A, 0x052F},
    {0x0531, 0x0556}, {0x10A0, 0x10C5}, {0x13A0, 0x13F5}, {0x13F8, 0x13FD}, {0x1C90, 0x1CBA},
    {0x1CBD, 0x1CBF}, {0x1D00, 0x1D2B}, {0x1D6B, 0x1D77}, {0x1D79, 0x1D9A}, {0x1E00, 0x1F15},
    {0x1F18, 0x1F1D}, {0x1F20, 0x1F45}, {0x1F48, 0x1F4D}, {0x1F50, 0x1F57}, {0x1F59, 0x1F59},
    {0x1F5B, 0x1F5B}, {0x1F5D, 0x1F5D}, {0x1F5F, 0x1F7D}, {0x1F80, 0x1FB4}, {0x1FB6, 0x1FBC},
    {0x1FBE, 0x1FBE}, {0x1FC2, 0x1FC4}, {0x1FC6, 0x1FCC}, {0x1FD0, 0x1FD3}, {0x1FD6, 0x1FDB},
    {0x1FE0, 0x1FEC}, {0x1FF2, 0x1FF4}, {0x1FF6, 0x1FFC}, {0x2102, 0x2102}, {0x2107, 0x2107},
    {0x210A, 0x2113}, {0x2115, 0x2115}, {0x2119, 0x211D}, {0x2124, 0x2124}, {0x2126, 0x2126},
    {0x2128, 0x2128}, {0x212A, 0x212D}, {0x212F, 0x2134}, {0x2139, 0x2139}, {0x213C, 0x213F},
    {0x2145, 0x2149}, {0x214E, 0x214E}, {0x2183, 0x2184}, {0x2C00, 0x2C7B}, {0x2C7E, 0x2CE4},
    {0x2CEB, 0x2CEE}, {0x2CF2, 0x2CF3}, {0xA640, 0xA66D}, {0xA680, 0xA69B}, {0xA722, 0xA76F},
    {0xA771, 0xA787}, {0xA78B, 0xA78E}, {0xAB70, 0xABBF}, {0xFB00, 0xFB06}, {0xFB13, 0xFB17},
    {0xFF21, 0xFF3A}, {0xFF41, 0xFF5A}, {0x10400, 0x1044F}, {0x104B0, 0x104D3},
    {0x104D8, 0x104FB}, {0x10C80, 0x10CB2}, {0x10CC0, 0x10CF2}, {0x118A0, 0x118DF},
    {0x1E900, 0x1E943},
};

// DeepSeek LLM's punctuation class [!-/:-~！-／：-～‘-‟　-。]: ASCII punctuation and letters,
// their full-width forms, curly quotes and CJK punctuation.
constexpr CodePointRange kDeepSeekPunctuation[] = {
    {0x21, 0x2F}, {0x3A, 0x7E}, {0x2018, 0x201F}, {0x3000, 0x3002}, {0xFF01, 0xFF0F},
    {0xFF1A, 0xFF5E},
};

// Both DeepSeek models' [一-龥ࠀ-一가-퟿]: CJK ideographs, most scripts from U+0800 on, Hangul.
constexpr CodePointRange kDeepSeekCjk[] = {{0x0800, 0x9FA5}, {0xAC00, 0xD7FF}};

// BLOOM's word class excludes these besides whitespace: [^(\s|.,!?…。，、।۔،)].
constexpr char32_t kBloomBreaks[] = {'(', '|', '.', ',', '!', '?', ')', 0x2026, 0x3002,
                                     0xFF0C, 0x3001, 0x0964, 0x06D4, 0x060C};

template <size_t N>
bool InRanges(char32_t cp, const CodePointRange (&ranges)[N]) {
  return std::any_of(std::begin(ranges), std::end(ranges),
                     [cp](const CodePointRange& r) { return cp >= r.first && cp <= r.last; });
}

bool IsSpace(const Char& ch) { return ch.cls.whitespace; }
bool IsLetter(const Char& ch) { return ch.cls.IsLetter(); }
bool IsNumber(const Char& ch) { return ch.cls.IsNumber(); }
bool IsPunctuation(const Char& ch) { return ch.cls.IsPunctuation(); }
bool IsNewline(const Char& ch) { return ch.cp == '\r' || ch.cp == '\n'; }
bool IsAsciiDigit(const Char& ch) { return ch.cp >= '0' && ch.cp <= '9'; }
// [^\s\p{L}\p{N}]
bool IsOther(const Char& ch) { return !IsSpace(ch) && !IsLetter(ch) && !IsNumber(ch); }

// The regexes with literal non-ASCII classes ran over text whose non-ASCII whitespace was
// replaced by U+000B (std::wregex's \s knows only ASCII), so whitespace is never in them.
bool IsDeepSeekLetter(const Char& ch) { return !IsSpace(ch) && InRanges(ch.cp, kDeepSeekLetters); }
bool IsDeepSeekPunctuation(const Char& ch) {
  return !IsSpace(ch) && InRanges(ch.cp, kDeepSeekPunctuation);
}
bool IsDeepSeekCjk(const Char& ch) { return !IsSpace(ch) && InRanges(ch.cp, kDeepSeekCjk); }
bool IsBloomWordChar(const Char& ch) {
  return !IsSpace(ch) && std::find(std::begin(kBloomBreaks), std::end(kBloomBreaks), ch.cp) ==
                             std::end(kBloomBreaks);
}

// [\p{P}$+<=>^~|]: punctuation and the ASCII symbols next to it in code.
bool IsDefaultPunctuation(const Char& ch) {
  constexpr std::u32string_view kSymbols = U"$+<=>^~|";
  return IsPunctuation(ch) || kSymbols.find(ch.cp) != std::u32string_view::npos;
}
// Falcon adds the backtick.
bool IsFalconPunctuation(const Char& ch) { return IsDefaultPunctuation(ch) || ch.cp == '`'; }

template <bool kMarksAreLetters>
bool IsWordChar(const Char& ch) {
  return IsLetter(ch) || (kMarksAreLetters && ch.cls.IsMark());
}
template <bool kMarksAreLetters>
bool IsOtherThanWord(const Char& ch) {
  return !IsSpace(ch) && !IsWordChar<kMarksAreLetters>(ch) && !IsNumber(ch);
}

size_t RunEnd(const Chars& c, size_t pos, size_t end, CharPredicate pred) {
  while (pos < end && pred(c[pos])) ++pos;
  return pos;
}

char32_t AsciiLower(char32_t cp) { return cp >= 'A' && cp <= 'Z' ? cp + ('a' - 'A') : cp; }

// The length of 's 't 're 've 'm 'll 'd at `pos`, 0 when none starts there.
size_t ContractionLength(const Chars& c, size_t pos, size_t end, bool ignore_case) {
  if (c[pos].cp != '\'' || pos + 1 >= end) return 0;
  auto at = [&](size_t i) { return ignore_case ? AsciiLower(c[i].cp) : c[i].cp; };
  const char32_t a = at(pos + 1);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return 2;
  if (pos + 2 >= end) return 0;
  const char32_t b = at(pos + 2);
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return 3;
  return 0;
}

// \s+(?!\S)|\s+ on the whitespace [pos, run_end): inside the piece the last whitespace
// character is left to prefix the word after it, unless it is the only one.
size_t WhitespaceMatchEnd(size_t pos, size_t run_end, size_t end) {
  return run_end < end && run_end - pos > 1 ? run_end - 1 : run_end;
}

size_t MatchGpt2(const Chars& c, size_t pos, size_t end) {
  if (const size_t n = ContractionLength(c, pos, end, /*ignore_case=*/false)) return pos + n;
  // " ?" before each class: a space joins the run it precedes.
  const size_t start = c[pos].cp == ' ' ? pos + 1 : pos;
  if (start < end) {
    for (CharPredicate cls : {IsLetter, IsNumber, IsOther}) {
      if (cls(c[start])) return RunEnd(c, start, end, cls);
    }
  }
  // Whatever is left starts with whitespace.
  return WhitespaceMatchEnd(pos, RunEnd(c, pos, end, IsSpace), end);
}

template <size_t kMaxDigits, bool kMarksAreLetters>
size_t MatchLlama3(const Chars& c, size_t pos, size_t end) {
  constexpr CharPredicate kWord = IsWordChar<kMarksAreLetters>;
  constexpr CharPredicate kOther = IsOtherThanWord<kMarksAreLetters>;
  if (const size_t n = ContractionLength(c, pos, end, /*ignore_case=*/true)) return pos + n;
  const Char& first = c[pos];
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (kWord(first)) return RunEnd(c, pos, end, kWord);
  if (!IsNewline(first) && !IsNumber(first) && pos + 1 < end && kWord(c[pos + 1])) {
    return RunEnd(c, pos + 1, end, kWord);
  }
  // \p{N}{1,kMaxDigits}
  if (IsNumber(first)) return RunEnd(c, pos, std::min(end, pos + kMaxDigits), IsNumber);
  // " ?[^\s\p{L}\p{N}]+[\r\n]*"
  const size_t start = first.cp == ' ' ? pos + 1 : pos;
  if (start < end && kOther(c[start])) {
    return RunEnd(c, RunEnd(c, start, end, kOther), end, IsNewline);
  }
  // Whatever is left starts with whitespace. \s*[\r\n]+ takes it up to its last newline.
  const size_t run_end = RunEnd(c, pos, end, IsSpace);
  for (size_t i = run_end; i > pos; --i) {
    if (IsNewline(c[i - 1])) return i;
  }
  return WhitespaceMatchEnd(pos, run_end, end);
}

template <CharPredicate kPred>
size_t MatchRun(const Chars& c, size_t pos, size_t end) {
  return kPred(c[pos]) ? RunEnd(c, pos, end, kPred) : pos;
}

template <CharPredicate kPred>
size_t MatchOne(const Chars& c, size_t pos, size_t) {
  return kPred(c[pos]) ? pos + 1 : pos;
}

// \s?X+
template <CharPredicate kPred>
size_t MatchRunAfterOptionalWhitespace(const Chars& c, size_t pos, size_t end) {
  const size_t start = IsSpace(c[pos]) ? pos + 1 : pos;
  return start < end && kPred(c[start]) ? RunEnd(c, start, end, kPred) : pos;
}

// " ?X+"
template <CharPredicate kPred>
size_t MatchRunAfterOptionalSpace(const Chars& c, size_t pos, size_t end) {
  const size_t start = c[pos].cp == ' ' ? pos + 1 : pos;
  return start < end && kPred(c[start]) ? RunEnd(c, start, end, kPred) : pos;
}

// [0-9][0-9][0-9]
size_t MatchAsciiDigitTriple(const Chars& c, size_t pos, size_t end) {
  if (end - pos < 3) return pos;
  return std::all_of(c.begin() + pos, c.begin() + pos + 3, IsAsciiDigit) ? pos + 3 : pos;
}

// [^\n]+|[\n]+
size_t MatchNewlineRunOrNot(const Chars& c, size_t pos, size_t end) {
  const bool newline = c[pos].cp == '\n';
  while (pos < end && (c[pos].cp == '\n') == newline) ++pos;
  return pos;
}

// Pieces are the matches, found leftmost first as a regex iterator finds them, and the text
// between them.
template <Matcher kMatch>
void SplitOnMatches(const Chars& c, size_t begin, size_t end, std::vector<size_t>* ends) {
  size_t gap = begin;
  for (size_t pos = begin; pos < end;) {
    const size_t match_end = kMatch(c, pos, end);
    if (match_end == pos) {
      ++pos;
      continue;
    }
    if (pos > gap) ends->push_back(pos);
    ends->push_back(match_end);
    pos = gap = match_end;
  }
  if (end > gap) ends->push_back(end);
}

// \s+$: the whitespace that ends the piece. Found from the end, so that a long run of
// whitespace inside the piece costs one pass.
void SplitTrailingWhitespace(const Chars& c, size_t begin, size_t end,
                             std::vector<size_t>* ends) {
  size_t trailing = end;
  while (trailing > begin && IsSpace(c[trailing - 1])) --trailing;
  if (trailing > begin) ends->push_back(trailing);
  if (end > trailing) ends->push_back(end);
}

std::span<const Splitter> Passes(PreTokenizer kind) {
  static constexpr Splitter kGpt2Passes[] = {SplitOnMatches<MatchGpt2>};
  static constexpr Splitter kDefaultPasses[] = {
      SplitOnMatches<MatchRun<IsDefaultPunctuation>>, SplitOnMatches<MatchGpt2>,
      SplitOnMatches<MatchRun<IsNumber>>, SplitOnMatches<MatchAsciiDigitTriple>};
  static constexpr Splitter kLlama3Passes[] = {SplitOnMatches<MatchLlama3<3, false>>};
  static constexpr Splitter kQwen2Passes[] = {SplitOnMatches<MatchLlama3<1, false>>};
  static constexpr Splitter kQwen35Passes[] = {SplitOnMatches<MatchLlama3<1, true>>};
  static constexpr Splitter kStarCoderPasses[] = {SplitOnMatches<MatchOne<IsNumber>>,
                                                  SplitOnMatches<MatchGpt2>};
  static constexpr Splitter kFalconPasses[] = {SplitOnMatches<MatchRun<IsFalconPunctuation>>,
                                               SplitOnMatches<MatchGpt2>,
                                               SplitOnMatches<MatchAsciiDigitTriple>};
  static constexpr Splitter kDeepSeekLlmPasses[] = {
      SplitOnMatches<MatchOne<IsNewline>>,
      SplitOnMatches<MatchRunAfterOptionalWhitespace<IsDeepSeekLetter>>,
      SplitOnMatches<MatchRunAfterOptionalWhitespace<IsDeepSeekPunctuation>>,
      SplitTrailingWhitespace,
      SplitOnMatches<MatchRun<IsDeepSeekCjk>>,
      SplitOnMatches<MatchRun<IsNumber>>};
  static constexpr Splitter kDeepSeekCoderPasses[] = {
      SplitOnMatches<MatchOne<IsNewline>>,
      SplitOnMatches<MatchRunAfterOptionalWhitespace<IsLetter>>,
      SplitOnMatches<MatchRunAfterOptionalWhitespace<IsPunctuation>>,
      SplitOnMatches<MatchRun<IsDeepSeekCjk>>,
      SplitOnMatches<MatchOne<IsNumber>>};
  static constexpr Splitter kBloomPasses[] = {
      SplitOnMatches<MatchRunAfterOptionalSpace<IsBloomWordChar>>};
  static constexpr Splitter kNewlinesPasses[] = {SplitOnMatches<MatchNewlineRunOrNot>};
  switch (kind) {
    case PreTokenizer::kDefault: return kDefaultPasses;
    case PreTokenizer::kGpt2: return kGpt2Passes;
    case PreTokenizer::kLlama3: return kLlama3Passes;
    case PreTokenizer::kQwen2: return kQwen2Passes;
    case PreTokenizer::kQwen35: return kQwen35Passes;
    case PreTokenizer::kStarCoder: return kStarCoderPasses;
    case PreTokenizer::kFalcon: return kFalconPasses;
    case PreTokenizer::kDeepSeekLlm: return kDeepSeekLlmPasses;
    case PreTokenizer::kDeepSeekCoder: return kDeepSeekCoderPasses;
    case PreTokenizer::kBloom: return kBloomPasses;
    case PreTokenizer::kNewlines: return kNewlinesPasses;
  }
  return kGpt2Passes;
}

Chars DecodeChars(std::string_view text) {
  Chars chars;
  chars.reserve(text.size());
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Scan scan = ScanUtf8(text.substr(pos));
    if (scan.kind == Utf8Scan::kValid) {
      const char32_t cp = DecodeUtf8(text.substr(pos), scan.length);
      chars.push_back({cp, ClassifyCodePoint(cp), pos});
      pos += scan.length;
    } else {
      chars.push_back({kReplacementChar, ClassifyCodePoint(kReplacementChar), pos});
      ++pos;
    }
  }
  return chars;
}

}  // namespace

std::vector<std::string_view> PreTokenize(PreTokenizer kind, std::string_view text) {
  if (text.empty()) return {};
  const Chars chars = DecodeChars(text);
  std::vector<size_t> ends = {chars.size()};
  std::vector<size_t> next;
  for (Splitter split : Passes(kind)) {
    next.clear();
    size_t begin = 0;
    for (size_t end : ends) {
      split(chars, begin, end, &next);
      begin = end;
    }
    ends.swap(next);
  }
  auto offset = [&](size_t i) { return i < chars.size() ? chars[i].offset : text.size(); };
  std::vector<std::string_view> words;
  words.reserve(ends.size());
  size_t begin = 0;
  for (size_t end : ends) {
    words.push_back(text.substr(offset(begin), offset(end) - offset(begin)));
    begin = end;
  }
  return words;
}

}  // namespace kvllm
