// BPE through the Tokenizer: merges by rank, word boundaries, special tokens, decoding.
#include <algorithm>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/byte_encoding.h"
#include "tokenizer/tokenizer.h"

namespace kvllm {
namespace {

using Ids = std::vector<TokenId>;

std::string Encoded(std::string_view raw) {
  std::string out;
  AppendByteEncoded(raw, &out);
  return out;
}

// A byte-level vocabulary: token b spells byte b (so ids 0..255 are the bytes), then merges.
// Tests name pieces by the raw text they stand for.
class ByteLevelVocab {
 public:
  ByteLevelVocab() {
    vocab_.kind = TokenizerKind::kBpe;
    vocab_.pre = PreTokenizer::kGpt2;
    vocab_.bos = vocab_.eos = vocab_.unk = kNoToken;
    vocab_.add_bos = false;
    vocab_.add_space_prefix = false;
    for (int b = 0; b < 256; ++b) vocab_.pieces.push_back(Encoded(std::string(1, char(b))));
  }
  // Appends the merge of `left` and `right` (its rank is the number of merges before it) and
  // the token it makes, unless that exists.
  TokenId Merge(std::string_view left, std::string_view right) {
    vocab_.merges.push_back(Encoded(left) + " " + Encoded(right));
    const std::string raw = std::string(left).append(right);
    const TokenId existing = Find(raw);
    return existing != kNoToken ? existing : Add(Encoded(raw));
  }
  TokenId Add(std::string piece, TokenType type = TokenType::kNormal) {
    vocab_.pieces.push_back(std::move(piece));
    vocab_.types.resize(vocab_.pieces.size() - 1, TokenType::kNormal);
    vocab_.types.push_back(type);
    return static_cast<TokenId>(vocab_.pieces.size() - 1);
  }
  TokenId Find(std::string_view raw) const {
    const std::string piece = Encoded(raw);
    for (size_t i = 0; i < vocab_.pieces.size(); ++i) {
      if (vocab_.pieces[i] == piece) return static_cast<TokenId>(i);
    }
    return kNoToken;
  }
  Vocab& vocab() { return vocab_; }
  Tokenizer Build() const {
    StatusOr<Tokenizer> tok = Tokenizer::FromVocab(vocab_);
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    return std::move(tok).value();
  }

 private:
  Vocab vocab_;
};

TEST(BpeTest, UnmergedTextIsOneTokenPerByte) {
  ByteLevelVocab v;
  const Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("a b\n", false), (Ids{'a', ' ', 'b', '\n'}));
  EXPECT_EQ(tok.Encode(std::string("\0\xFF", 2), false), (Ids{0, 0xFF}));
  EXPECT_EQ(tok.Encode("\xC3\xA9", false), (Ids{0xC3, 0xA9}));  // é
  EXPECT_EQ(tok.Encode("", false), Ids{});
}

TEST(BpeTest, MergesByRankNotLengthOrPosition) {
  ByteLevelVocab v;
  const TokenId bc = v.Merge("b", "c");
  const TokenId ab = v.Merge("a", "b");
  EXPECT_EQ(v.Build().Encode("abc", false), (Ids{'a', bc}));

  ByteLevelVocab flipped;
  const TokenId ab2 = flipped.Merge("a", "b");
  flipped.Merge("b", "c");
  EXPECT_EQ(flipped.Build().Encode("abc", false), (Ids{ab2, 'c'}));
  EXPECT_NE(ab, kNoToken);
}

TEST(BpeTest, EqualPairsMergeLeftmostFirst) {
  ByteLevelVocab v;
  const TokenId aa = v.Merge("a", "a");
  const Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("aaa", false), (Ids{aa, 'a'}));
  EXPECT_EQ(tok.Encode("aaaa", false), (Ids{aa, aa}));
}

TEST(BpeTest, MergesBuildOnMerges) {
  ByteLevelVocab v;
  v.Merge("h", "e");
  v.Merge("l", "l");
  v.Merge("he", "ll");
  const TokenId hello = v.Merge("hell", "o");
  const TokenId space_w = v.Merge(" ", "w");
  const TokenId space_wo = v.Merge(" w", "o");
  const Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("hello wo", false), (Ids{hello, space_wo}));
  EXPECT_EQ(tok.Encode("hello w", false), (Ids{hello, space_w}));
  // "hell" + "o" needs "hell", which only "he" + "ll" makes.
  EXPECT_EQ(tok.Encode("hellohello", false), (Ids{hello, hello}));
}

TEST(BpeTest, MergesStayInsideWords) {
  ByteLevelVocab v;
  const TokenId o_space = v.Merge("o", " ");
  const TokenId space_w = v.Merge(" ", "w");
  const Tokenizer tok = v.Build();
  // The pre-tokenizer puts the space with "w": "o " is never a candidate.
  EXPECT_EQ(tok.Encode("o w", false), (Ids{'o', space_w}));
  // At the end of the text the spaces are a word of their own.
  EXPECT_EQ(tok.Encode("o  ", false), (Ids{'o', ' ', ' '}));
  EXPECT_NE(o_space, kNoToken);
}

TEST(BpeTest, IgnoreMergesTakesWholeWords) {
  ByteLevelVocab v;
  const TokenId hello = v.Add(Encoded("hello"));  // no merges lead to it
  EXPECT_EQ(v.Build().Encode("hello", false), (Ids{'h', 'e', 'l', 'l', 'o'}));
  v.vocab().ignore_merges = true;
  const Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("hello", false), (Ids{hello}));
  EXPECT_EQ(tok.Encode("hellos", false), (Ids{'h', 'e', 'l', 'l', 'o', 's'}));
}

TEST(BpeTest, PreTokenizerComesFromTheVocabulary) {
  ByteLevelVocab v;
  const TokenId twelve = v.Merge("1", "2");
  EXPECT_EQ(v.Build().Encode("12", false), (Ids{twelve}));
  v.vocab().pre = PreTokenizer::kQwen2;  // single digits
  EXPECT_EQ(v.Build().Encode("12", false), (Ids{'1', '2'}));
}

TEST(BpeTest, UserDefinedTokensAreMatchedVerbatim) {
  ByteLevelVocab v;
  const TokenId tab2 = v.Add("\t\t", TokenType::kUserDefined);
  const TokenId ab = v.Add("ab", TokenType::kUserDefined);
  const TokenId abc = v.Add("abc", TokenType::kUserDefined);
  const Tokenizer tok = v.Build();
  // The longest one that starts at a place wins; text around them is tokenized apart.
  EXPECT_EQ(tok.Encode("xabcd\t\t\ty", false), (Ids{'x', abc, 'd', tab2, '\t', 'y'}));
  EXPECT_EQ(tok.Encode("abab", false), (Ids{ab, ab}));
  // They render as their text, not as byte-level spelling.
  EXPECT_EQ(tok.TokenToPiece(tab2), "\t\t");
  EXPECT_EQ(tok.Decode(tok.Encode("xabcd\t\t\ty", false)), "xabcd\t\t\ty");
}

TEST(BpeTest, ControlTokensNeedParseSpecial) {
  ByteLevelVocab v;
  const TokenId start = v.Add("<|im_start|>", TokenType::kControl);
  const Tokenizer tok = v.Build();
  const Ids plain = tok.Encode("<|im_start|>user", false);
  EXPECT_EQ(std::count(plain.begin(), plain.end(), start), 0);
  EXPECT_EQ(tok.Decode(plain), "<|im_start|>user");
  const Ids parsed = tok.Encode("<|im_start|>user", false, /*parse_special=*/true);
  EXPECT_EQ(parsed, (Ids{start, 'u', 's', 'e', 'r'}));
  EXPECT_TRUE(tok.IsControl(start));
  EXPECT_EQ(tok.TokenToPiece(start), "");
}

TEST(BpeTest, AddsBosAndEosAsAsked) {
  ByteLevelVocab v;
  const TokenId bos = v.Add("<|begin|>", TokenType::kControl);
  const TokenId eos = v.Add("<|end|>", TokenType::kControl);
  v.vocab().bos = bos;
  v.vocab().eos = eos;
  EXPECT_EQ(v.Build().Encode("a", true), (Ids{'a'}));
  v.vocab().add_bos = true;
  v.vocab().add_eos = true;
  const Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("a", true), (Ids{bos, 'a', eos}));
  EXPECT_EQ(tok.Encode("a", false), (Ids{'a'}));
  EXPECT_TRUE(tok.IsEog(eos));
  EXPECT_FALSE(tok.IsEog(bos));
  EXPECT_EQ(tok.Decode({bos, 'a', eos}), "a");
}

TEST(BpeTest, DecodesByteLevelPieces) {
  ByteLevelVocab v;
  const TokenId space_w = v.Merge(" ", "w");
  const Tokenizer tok = v.Build();
  EXPECT_EQ(tok.TokenToPiece(' '), " ");
  EXPECT_EQ(tok.TokenToPiece('\n'), "\n");
  EXPECT_EQ(tok.TokenToPiece(0xC3), "\xC3");
  EXPECT_EQ(tok.TokenToPiece(space_w), " w");
  // No prefix is stripped: BPE adds none.
  EXPECT_EQ(tok.Decode({' ', 'a'}), " a");
  const std::string texts[] = {
      "Hello, World! 123",
      "h\xC3\xA9llo w\xC3\xB6rld \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC",
      "  leading and trailing  \n\n\t",
      std::string("nul\0byte", 8),
      "invalid \xFF\xC0 bytes \xE2\x82",
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(tok.Decode(tok.Encode(text, false)), text);
  }
}

TEST(BpeTest, StreamsAnEmojiSplitAcrossByteTokens) {
  ByteLevelVocab v;
  const Tokenizer tok = v.Build();
  const Ids ids = tok.Encode("\xF0\x9F\xA6\x99!", false);  // 🦙!
  ASSERT_EQ(ids.size(), 5u);
  Utf8Streamer streamer;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string released = streamer.Push(tok.TokenToPiece(ids[i]));
    if (i < 3) {
      EXPECT_EQ(released, "") << "token " << i;
    }
    out += released;
  }
  EXPECT_EQ(out + streamer.Flush(), "\xF0\x9F\xA6\x99!");
}

// Gemma 4's kind: raw UTF-8 with '▁' for spaces, words are newline runs and the rest, and
// <0xNN> tokens for characters without a piece.
TEST(BpeTest, NewlinesKindMergesUtf8WithByteFallback) {
  Vocab vocab;
  vocab.kind = TokenizerKind::kBpe;
  vocab.pre = PreTokenizer::kNewlines;
  vocab.bos = vocab.eos = vocab.unk = kNoToken;
  vocab.add_bos = false;
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    vocab.pieces.push_back(name);
    vocab.types.push_back(TokenType::kByte);
  }
  const auto add = [&](std::string piece) {
    vocab.pieces.push_back(std::move(piece));
    vocab.types.push_back(TokenType::kNormal);
    return static_cast<TokenId>(vocab.pieces.size() - 1);
  };
  const TokenId marker = add("\xE2\x96\x81");
  const TokenId a = add("a");
  const TokenId b = add("b");
  const TokenId marker_a = add("\xE2\x96\x81" "a");
  const TokenId newlines = add("\n\n");  // reached by no merge
  vocab.merges = {"\xE2\x96\x81 a"};
  StatusOr<Tokenizer> tok = Tokenizer::FromVocab(vocab);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->Encode("a a\n\nb ", false), (Ids{a, marker_a, newlines, b, marker}));
  EXPECT_EQ(tok->Encode("\xC3\xA9", false), (Ids{0xC3, 0xA9}));
  EXPECT_EQ(tok->Decode(tok->Encode("a a\n\nb \xC3\xA9", false)), "a a\n\nb \xC3\xA9");
  EXPECT_EQ(tok->TokenToPiece(marker_a), " a");
}

}  // namespace
}  // namespace kvllm
