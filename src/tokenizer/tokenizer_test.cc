#include "tokenizer/tokenizer.h"

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/byte_encoding.h"

namespace kvllm {
namespace {

constexpr TokenId kUnk = 0, kBos = 1, kEos = 2;
constexpr TokenId kFirstByte = 3;  // <0x00> .. <0xFF> are ids 3 .. 258

TokenId ByteId(uint8_t byte) { return kFirstByte + byte; }

// A small Llama-like vocabulary: <unk>, <s>, </s>, 256 byte tokens, then scored pieces.
class TestVocab {
 public:
  TestVocab() {
    Add("<unk>", 0, TokenType::kUnknown);
    Add("<s>", 0, TokenType::kControl);
    Add("</s>", 0, TokenType::kControl);
    for (int b = 0; b < 256; ++b) {
      char name[8];
      std::snprintf(name, sizeof(name), "<0x%02X>", b);
      Add(name, 0, TokenType::kByte);
    }
  }
  TokenId Add(std::string piece, float score, TokenType type = TokenType::kNormal) {
    vocab_.pieces.push_back(std::move(piece));
    vocab_.scores.push_back(score);
    vocab_.types.push_back(type);
    return static_cast<TokenId>(vocab_.pieces.size() - 1);
  }
  Vocab& vocab() { return vocab_; }
  const Vocab& vocab() const { return vocab_; }
  Tokenizer Build() {
    StatusOr<Tokenizer> tok = Tokenizer::FromVocab(vocab_);
    EXPECT_TRUE(tok.ok()) << tok.status().message();
    return std::move(tok).value();
  }

 private:
  Vocab vocab_;
};

// Pieces for "hello world", reachable only through the intermediate merges.
struct HelloVocab {
  HelloVocab() {
    marker = vocab.Add("\xE2\x96\x81", -100);
    for (const char* c : {"h", "e", "l", "o", "w", "r", "d", "a", "b", "c"}) {
      vocab.Add(c, -100);
    }
    he = vocab.Add("he", -1);
    ll = vocab.Add("ll", -2);
    llo = vocab.Add("llo", -3);
    hello = vocab.Add("hello", -4);
    space_hello = vocab.Add("\xE2\x96\x81hello", -5);
    space_w = vocab.Add("\xE2\x96\x81w", -6);
    orr = vocab.Add("or", -7);
    ld = vocab.Add("ld", -8);
  }
  TestVocab vocab;
  TokenId marker, he, ll, llo, hello, space_hello, space_w, orr, ld;
};

TEST(TokenizerTest, MergesThroughIntermediatePieces) {
  HelloVocab h;
  Tokenizer tok = h.vocab.Build();
  EXPECT_EQ(tok.Encode("hello world", false),
            (std::vector<TokenId>{h.space_hello, h.space_w, h.orr, h.ld}));
}

TEST(TokenizerTest, MergeOrderFollowsScoresNotLength) {
  TestVocab v;
  v.vocab().add_space_prefix = false;
  const TokenId a = v.Add("a", -10);
  v.Add("b", -10);
  const TokenId c = v.Add("c", -10);
  const TokenId ab = v.Add("ab", -2);
  const TokenId bc = v.Add("bc", -1);
  Tokenizer tok = v.Build();
  // Longest match from the left would give "ab" "c"; "bc" scores higher, so it merges first.
  EXPECT_EQ(tok.Encode("abc", false), (std::vector<TokenId>{a, bc}));
  // Once "ab" outscores "bc" the result flips.
  v.vocab().scores[ab] = 0;
  Tokenizer flipped = v.Build();
  EXPECT_EQ(flipped.Encode("abc", false), (std::vector<TokenId>{ab, c}));
}

TEST(TokenizerTest, EqualScoresMergeLeftmostFirst) {
  TestVocab v;
  v.vocab().add_space_prefix = false;
  const TokenId a = v.Add("a", -10);
  const TokenId aa = v.Add("aa", -1);
  Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("aaa", false), (std::vector<TokenId>{aa, a}));
  EXPECT_EQ(tok.Encode("aaaa", false), (std::vector<TokenId>{aa, aa}));
}

TEST(TokenizerTest, AddsSpacePrefixUnlessDisabled) {
  HelloVocab h;
  Tokenizer with_prefix = h.vocab.Build();
  EXPECT_EQ(with_prefix.Encode("hello", false), (std::vector<TokenId>{h.space_hello}));
  h.vocab.vocab().add_space_prefix = false;
  Tokenizer without_prefix = h.vocab.Build();
  EXPECT_EQ(without_prefix.Encode("hello", false), (std::vector<TokenId>{h.hello}));
}

TEST(TokenizerTest, SpacesBecomeSpaceMarkers) {
  TestVocab v;
  const TokenId marker = v.Add("\xE2\x96\x81", -1);
  const TokenId x = v.Add("x", -1);
  Tokenizer tok = v.Build();
  // Prefix + two spaces, no "▁▁" piece: three separate markers.
  EXPECT_EQ(tok.Encode("  x", false), (std::vector<TokenId>{marker, marker, marker, x}));
}

TEST(TokenizerTest, FallsBackToBytesForUnknownCharacters) {
  TestVocab v;
  const TokenId marker = v.Add("\xE2\x96\x81", -1);
  Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("\xC3\xA9", false),  // é
            (std::vector<TokenId>{marker, ByteId(0xC3), ByteId(0xA9)}));
  EXPECT_EQ(tok.Encode("\xF0\x9F\x98\x80", false),  // 😀
            (std::vector<TokenId>{marker, ByteId(0xF0), ByteId(0x9F), ByteId(0x98),
                                  ByteId(0x80)}));
}

TEST(TokenizerTest, KnownMultibyteCharacterIsOnePiece) {
  TestVocab v;
  v.vocab().add_space_prefix = false;
  const TokenId e_acute = v.Add("\xC3\xA9", -1);
  Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("\xC3\xA9\xC3\xA9", false), (std::vector<TokenId>{e_acute, e_acute}));
}

TEST(TokenizerTest, InvalidUtf8BytesBecomeByteTokens) {
  TestVocab v;
  v.vocab().add_space_prefix = false;
  const TokenId a = v.Add("a", -1);
  Tokenizer tok = v.Build();
  // A stray continuation byte and a truncated 3-byte sequence.
  EXPECT_EQ(tok.Encode("a\x80" "a\xE2\x82", false),
            (std::vector<TokenId>{a, ByteId(0x80), a, ByteId(0xE2), ByteId(0x82)}));
}

TEST(TokenizerTest, WithoutByteTokensUnknownCharactersBecomeUnk) {
  Vocab vocab;
  vocab.pieces = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "a"};
  vocab.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl,
                 TokenType::kNormal, TokenType::kNormal};
  StatusOr<Tokenizer> tok = Tokenizer::FromVocab(vocab);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // One <unk> per character, not per byte.
  EXPECT_EQ(tok->Encode("a\xC3\xA9" "a", false), (std::vector<TokenId>{3, 4, kUnk, 4}));
  EXPECT_EQ(tok->Decode({3, 4, kUnk}), "a<unk>");
}

TEST(TokenizerTest, AddsBosAndEosAsTheVocabularySays) {
  HelloVocab h;
  Tokenizer bos_only = h.vocab.Build();
  EXPECT_EQ(bos_only.Encode("hello", true), (std::vector<TokenId>{kBos, h.space_hello}));
  EXPECT_EQ(bos_only.Encode("", true), (std::vector<TokenId>{kBos}));
  EXPECT_EQ(bos_only.Encode("hello", false), (std::vector<TokenId>{h.space_hello}));

  h.vocab.vocab().add_eos = true;
  Tokenizer both = h.vocab.Build();
  EXPECT_EQ(both.Encode("hello", true), (std::vector<TokenId>{kBos, h.space_hello, kEos}));

  h.vocab.vocab().add_bos = false;
  Tokenizer eos_only = h.vocab.Build();
  EXPECT_EQ(eos_only.Encode("hello", true), (std::vector<TokenId>{h.space_hello, kEos}));
  EXPECT_FALSE(eos_only.add_bos());
}

TEST(TokenizerTest, ControlTokensAreNotMatchedFromText) {
  TestVocab v;
  v.vocab().add_space_prefix = false;
  const TokenId lt = v.Add("<", -1);
  const TokenId s = v.Add("s", -1);
  const TokenId gt = v.Add(">", -1);
  const TokenId lt_s = v.Add("<s", -1);
  const TokenId slash = v.Add("/", -1);
  Tokenizer tok = v.Build();
  EXPECT_EQ(tok.Encode("<s>", false), (std::vector<TokenId>{lt_s, gt}));
  EXPECT_EQ(tok.Encode("</s>", false), (std::vector<TokenId>{lt, slash, s, gt}));
  // Byte token names are not text pieces either: "<0x41>" is spelled out, never 'A'.
  const std::vector<TokenId> ids = tok.Encode("<0x41>", false);
  EXPECT_EQ(std::count(ids.begin(), ids.end(), ByteId('A')), 0);
  EXPECT_EQ(tok.Decode(ids), "<0x41>");
}

TEST(TokenizerTest, ParseSpecialMatchesControlTokens) {
  HelloVocab h;
  const Tokenizer tok = h.vocab.Build();
  // As after BOS, the text after a special token gets the space prefix.
  EXPECT_EQ(tok.Encode("<s>hello</s>", false, /*parse_special=*/true),
            (std::vector<TokenId>{kBos, h.space_hello, kEos}));
  EXPECT_EQ(tok.Encode("<s>", true, /*parse_special=*/true), (std::vector<TokenId>{kBos, kBos}));
  EXPECT_EQ(tok.Encode("<unk>", false, /*parse_special=*/true), (std::vector<TokenId>{kUnk}));
}

TEST(TokenizerTest, UserDefinedTokensAreMatchedVerbatim) {
  HelloVocab h;
  const TokenId sep = h.vocab.Add("<sep>", 0, TokenType::kUserDefined);
  const Tokenizer tok = h.vocab.Build();
  // With or without parse_special; the text after one gets the space prefix, as in llama.cpp.
  const std::vector<TokenId> expected = {h.space_hello, sep, h.space_hello};
  EXPECT_EQ(tok.Encode("hello<sep>hello", false), expected);
  EXPECT_EQ(tok.Encode("hello<sep>hello", false, /*parse_special=*/true), expected);
  EXPECT_EQ(tok.TokenToPiece(sep), "<sep>");
  EXPECT_EQ(tok.Decode(expected), "hello<sep> hello");
}

TEST(TokenizerTest, EndOfGenerationTokens) {
  TestVocab v;
  const TokenId eot = v.Add("<|eot|>", 0, TokenType::kControl);
  const TokenId x = v.Add("x", -1);
  v.vocab().eog = {eot};
  const Tokenizer tok = v.Build();
  EXPECT_TRUE(tok.IsEog(kEos));
  EXPECT_TRUE(tok.IsEog(eot));
  EXPECT_FALSE(tok.IsEog(x));
  EXPECT_FALSE(tok.IsEog(kNoToken));
}

TEST(TokenizerTest, TokenToPiece) {
  HelloVocab h;
  Tokenizer tok = h.vocab.Build();
  EXPECT_EQ(tok.TokenToPiece(h.space_hello), " hello");
  EXPECT_EQ(tok.TokenToPiece(h.hello), "hello");
  EXPECT_EQ(tok.TokenToPiece(ByteId('A')), "A");
  EXPECT_EQ(tok.TokenToPiece(ByteId(0xE2)), "\xE2");
  EXPECT_EQ(tok.TokenToPiece(ByteId(0x00)), std::string(1, '\0'));
  EXPECT_EQ(tok.TokenToPiece(kBos), "");
  EXPECT_EQ(tok.TokenToPiece(kEos), "");
  EXPECT_EQ(tok.TokenToPiece(kUnk), "<unk>");
  EXPECT_EQ(tok.TokenToPiece(-1), "");
  EXPECT_EQ(tok.TokenToPiece(tok.vocab_size()), "");
  EXPECT_TRUE(tok.IsControl(kBos));
  EXPECT_FALSE(tok.IsControl(h.hello));
  EXPECT_TRUE(tok.IsEog(kEos));
  EXPECT_FALSE(tok.IsEog(kBos));
}

TEST(TokenizerTest, DecodeStripsOnlyTheAddedLeadingSpace) {
  HelloVocab h;
  Tokenizer tok = h.vocab.Build();
  const std::vector<TokenId> ids = {kBos, h.space_hello, h.space_w, h.orr, h.ld, kEos};
  EXPECT_EQ(tok.Decode(ids), "hello world");
  EXPECT_EQ(tok.Decode(ids, /*strip_leading_space=*/false), " hello world");
  EXPECT_EQ(tok.Decode({}), "");

  h.vocab.vocab().add_space_prefix = false;
  Tokenizer no_prefix = h.vocab.Build();
  EXPECT_EQ(no_prefix.Decode({h.space_hello}), " hello");
}

TEST(TokenizerTest, EncodeDecodeRoundTrips) {
  HelloVocab h;
  Tokenizer tok = h.vocab.Build();
  h.vocab.vocab().add_space_prefix = false;
  Tokenizer no_prefix = h.vocab.Build();
  const std::string texts[] = {
      "hello world",
      "Hello, World! 123 (ascii) ~`",
      "h\xC3\xA9llo w\xC3\xB6rld \xF0\x9F\x98\x80 \xE6\x97\xA5\xE6\x9C\xAC",  // héllo wörld 😀 日本
      "",
      " ",
      "   ",
      "  leading and trailing  ",
      "a\tb\nc\r\n  d",
      std::string("nul\0byte", 8),
      "invalid \xFF\xC0 bytes \xE2\x82",
  };
  for (const std::string& text : texts) {
    EXPECT_EQ(tok.Decode(tok.Encode(text, true)), text) << "text: \"" << text << "\"";
    EXPECT_EQ(no_prefix.Decode(no_prefix.Encode(text, true)), text)
        << "text: \"" << text << "\"";
  }
}

TEST(TokenizerTest, ScoresAndTypesDefault) {
  Vocab vocab;
  vocab.pieces = {"<unk>", "<s>", "</s>", "\xE2\x96\x81", "x", "\xE2\x96\x81x"};
  StatusOr<Tokenizer> tok = Tokenizer::FromVocab(vocab);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), 6);
  // With every type defaulting to normal, nothing is a control token.
  EXPECT_FALSE(tok->IsControl(1));
  EXPECT_EQ(tok->Encode("x", false), (std::vector<TokenId>{5}));
}

std::string FromVocabError(const Vocab& vocab) {
  StatusOr<Tokenizer> tok = Tokenizer::FromVocab(vocab);
  return tok.ok() ? "" : tok.status().message();
}

TEST(TokenizerTest, FromVocabRejectsInvalidInput) {
  Vocab good;
  good.pieces = {"<unk>", "<s>", "</s>", "a"};
  ASSERT_EQ(FromVocabError(good), "");

  EXPECT_NE(FromVocabError(Vocab{}), "");

  Vocab bad = good;
  bad.scores = {0, 0};
  EXPECT_NE(FromVocabError(bad).find("scores"), std::string::npos);

  bad = good;
  bad.types = {TokenType::kNormal};
  EXPECT_NE(FromVocabError(bad).find("types"), std::string::npos);

  bad = good;
  bad.types = {TokenType::kNormal, TokenType::kNormal, TokenType::kNormal,
               static_cast<TokenType>(9)};
  EXPECT_NE(FromVocabError(bad).find("type"), std::string::npos);

  bad = good;
  bad.bos = 4;
  EXPECT_NE(FromVocabError(bad).find("bos"), std::string::npos);
  bad = good;
  bad.eos = -2;
  EXPECT_NE(FromVocabError(bad).find("eos"), std::string::npos);
  // kNoToken means "none", which is fine unless the token is to be added.
  bad = good;
  bad.eos = kNoToken;
  bad.unk = kNoToken;
  EXPECT_EQ(FromVocabError(bad), "");
  bad.add_eos = true;
  EXPECT_NE(FromVocabError(bad).find("eos"), std::string::npos);
  bad = good;
  bad.bos = kNoToken;
  EXPECT_NE(FromVocabError(bad).find("bos"), std::string::npos);
  bad.add_bos = false;
  EXPECT_EQ(FromVocabError(bad), "");
  bad = good;
  bad.eog = {4};
  EXPECT_NE(FromVocabError(bad).find("end-of-generation"), std::string::npos);
  bad = good;
  bad.unk = 100;
  EXPECT_NE(FromVocabError(bad).find("unknown"), std::string::npos);

  bad = good;
  bad.pieces.push_back("a");
  EXPECT_NE(FromVocabError(bad).find("\"a\""), std::string::npos);

  bad = good;
  bad.pieces = {"<unk>", "<s>", "</s>", "<0xZZ>"};
  bad.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kControl, TokenType::kByte};
  EXPECT_NE(FromVocabError(bad).find("<0xZZ>"), std::string::npos);

  bad.pieces = {"<unk>", "<s>", "<0x4a>", "<0x4A>"};
  bad.types = {TokenType::kUnknown, TokenType::kControl, TokenType::kByte, TokenType::kByte};
  EXPECT_NE(FromVocabError(bad).find("byte"), std::string::npos);
}

// --- Utf8Streamer ---------------------------------------------------------------------------


TEST(Utf8StreamerTest, PassesCompleteTextThrough) {
  Utf8Streamer streamer;
  EXPECT_EQ(streamer.Push("hello "), "hello ");
  EXPECT_EQ(streamer.Push("w\xC3\xB6rld"), "w\xC3\xB6rld");
  EXPECT_EQ(streamer.Flush(), "");
}

TEST(Utf8StreamerTest, HoldsBackASplitCharacterUntilComplete) {
  Utf8Streamer streamer;  // € is E2 82 AC
  EXPECT_EQ(streamer.Push("a\xE2"), "a");
  EXPECT_EQ(streamer.Push("\x82"), "");
  EXPECT_EQ(streamer.Push("\xAC!"), "\xE2\x82\xAC!");
  EXPECT_EQ(streamer.Flush(), "");
}

TEST(Utf8StreamerTest, StreamsByteTokensOfAnEmoji) {
  TestVocab v;
  const TokenId marker = v.Add("\xE2\x96\x81", -1);
  Tokenizer tok = v.Build();
  const std::vector<TokenId> ids = tok.Encode("\xF0\x9F\x98\x80", false);
  ASSERT_EQ(ids.size(), 5u);
  EXPECT_EQ(ids[0], marker);
  Utf8Streamer streamer;
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) {
    const std::string released = streamer.Push(tok.TokenToPiece(ids[i]));
    if (i > 0 && i + 1 < ids.size()) {
      EXPECT_EQ(released, "") << "token " << i;
    }
    out += released;
  }
  EXPECT_EQ(out, " \xF0\x9F\x98\x80");
}

// U+FFFD is EF BF BD.
TEST(Utf8StreamerTest, InvalidBytesBecomeReplacementCharacters) {
  Utf8Streamer streamer;
  EXPECT_EQ(streamer.Push("x\x80y"), "x\xEF\xBF\xBDy");
  EXPECT_EQ(streamer.Push("\xFF"), "\xEF\xBF\xBD");
  // A sequence cut short by an ASCII byte: one U+FFFD for the maximal invalid prefix.
  EXPECT_EQ(streamer.Push("\xE2\x82"), "");
  EXPECT_EQ(streamer.Push("A"), "\xEF\xBF\xBD" "A");
  // Overlong encodings and surrogates are never valid.
  EXPECT_EQ(streamer.Push("\xC0\xAF"), "\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(streamer.Push("\xED\xA0\x80"), "\xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD");
  EXPECT_EQ(streamer.Flush(), "");
}

TEST(Utf8StreamerTest, FlushReplacesAnUnfinishedCharacter) {
  Utf8Streamer streamer;
  EXPECT_EQ(streamer.Push("ok\xF0\x9F\x98"), "ok");
  EXPECT_EQ(streamer.Flush(), "\xEF\xBF\xBD");
  EXPECT_EQ(streamer.Flush(), "");
  EXPECT_EQ(streamer.Push("again"), "again");
}

TEST(Utf8StreamerTest, ScanUtf8Classifies) {
  EXPECT_EQ(ScanUtf8("a").kind, Utf8Scan::kValid);
  EXPECT_EQ(ScanUtf8("\xF4\x8F\xBF\xBF").length, 4u);  // U+10FFFF
  EXPECT_EQ(ScanUtf8("\xF4\x90\x80\x80").kind, Utf8Scan::kInvalid);  // past U+10FFFF
  EXPECT_EQ(ScanUtf8("\xE0\x80\x80").kind, Utf8Scan::kInvalid);      // overlong
  const Utf8Scan partial = ScanUtf8("\xF0\x9F\x98");
  EXPECT_EQ(partial.kind, Utf8Scan::kIncomplete);
  EXPECT_EQ(partial.length, 3u);
  const Utf8Scan cut = ScanUtf8("\xF0\x9F\x98" "A");
  EXPECT_EQ(cut.kind, Utf8Scan::kInvalid);
  EXPECT_EQ(cut.length, 3u);
}

TEST(Utf8Test, DecodesAndEncodesCodePoints) {
  for (char32_t cp : {U'\0', U'A', U'\x7F', U'\x80', U'\xE9', U'\u07FF', U'\u0800', U'\u4E2D',
                      U'\uFFFD', U'\U00010000', U'\U0001F999', U'\U0010FFFF'}) {
    std::string bytes;
    AppendUtf8(cp, &bytes);
    const Utf8Scan scan = ScanUtf8(bytes);
    ASSERT_EQ(scan.kind, Utf8Scan::kValid) << static_cast<uint32_t>(cp);
    EXPECT_EQ(scan.length, bytes.size());
    EXPECT_EQ(DecodeUtf8(bytes, scan.length), cp);
  }
  std::string euro;
  AppendUtf8(0x20AC, &euro);
  EXPECT_EQ(euro, "\xE2\x82\xAC");
}

// --- FromGguf -------------------------------------------------------------------------------

// Writes a GGUF v3 file with metadata only, for FromGguf.
class GgufWriter {
 public:
  void String(std::string_view key, std::string_view value) {
    Key(key, gguf::ValueType::kString);
    Str(value);
  }
  void Uint32(std::string_view key, uint32_t value) {
    Key(key, gguf::ValueType::kUint32);
    Pod(value);
  }
  void Bool(std::string_view key, bool value) {
    Key(key, gguf::ValueType::kBool);
    Pod(static_cast<uint8_t>(value));
  }
  void Strings(std::string_view key, const std::vector<std::string>& values) {
    ArrayHeader(key, gguf::ValueType::kString, values.size());
    for (const std::string& v : values) Str(v);
  }
  void Floats(std::string_view key, const std::vector<float>& values) {
    ArrayHeader(key, gguf::ValueType::kFloat32, values.size());
    for (float v : values) Pod(v);
  }
  void Int32s(std::string_view key, const std::vector<int32_t>& values) {
    ArrayHeader(key, gguf::ValueType::kInt32, values.size());
    for (int32_t v : values) Pod(v);
  }
  // The finished file; keep it alive while the parsed GgufFile is used.
  std::string Finish() const {
    std::string out = "GGUF";
    auto put = [&out](const auto& v) {
      out.append(reinterpret_cast<const char*>(&v), sizeof(v));
    };
    put(uint32_t{3});
    put(uint64_t{0});  // tensors
    put(n_kv_);
    out += body_;
    out.resize((out.size() + 31) / 32 * 32, '\0');
    return out;
  }

 private:
  template <typename T>
  void Pod(T v) {
    body_.append(reinterpret_cast<const char*>(&v), sizeof(v));
  }
  void Str(std::string_view s) {
    Pod(static_cast<uint64_t>(s.size()));
    body_.append(s);
  }
  void Key(std::string_view key, gguf::ValueType type) {
    Str(key);
    Pod(static_cast<uint32_t>(type));
    ++n_kv_;
  }
  void ArrayHeader(std::string_view key, gguf::ValueType elem, size_t n) {
    Key(key, gguf::ValueType::kArray);
    Pod(static_cast<uint32_t>(elem));
    Pod(static_cast<uint64_t>(n));
  }

  std::string body_;
  uint64_t n_kv_ = 0;
};

// The HelloVocab as GGUF metadata, minus the keys a test wants to write itself.
void WriteHelloVocab(GgufWriter& w, const HelloVocab& h, bool with_model = true,
                     bool with_tokens = true) {
  const Vocab& v = h.vocab.vocab();
  if (with_model) w.String("tokenizer.ggml.model", "llama");
  if (with_tokens) w.Strings("tokenizer.ggml.tokens", v.pieces);
  w.Floats("tokenizer.ggml.scores", v.scores);
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  w.Int32s("tokenizer.ggml.token_type", types);
}

std::string FromGgufError(const std::string& bytes) {
  StatusOr<gguf::GgufFile> file = gguf::GgufFile::Parse(bytes.data(), bytes.size());
  if (!file.ok()) return "parse failed: " + file.status().message();
  StatusOr<Tokenizer> tok = Tokenizer::FromGguf(*file);
  return tok.ok() ? "" : tok.status().message();
}

TEST(TokenizerGgufTest, LoadsAVocabulary) {
  HelloVocab h;
  GgufWriter w;
  WriteHelloVocab(w, h);
  w.Uint32("tokenizer.ggml.bos_token_id", 1);
  w.Uint32("tokenizer.ggml.eos_token_id", 2);
  w.Uint32("tokenizer.ggml.unknown_token_id", 0);
  w.Bool("tokenizer.ggml.add_bos_token", true);
  w.Bool("tokenizer.ggml.add_eos_token", true);
  const std::string bytes = w.Finish();
  StatusOr<gguf::GgufFile> file = gguf::GgufFile::Parse(bytes.data(), bytes.size());
  ASSERT_TRUE(file.ok()) << file.status().message();
  StatusOr<Tokenizer> tok = Tokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->vocab_size(), static_cast<int32_t>(h.vocab.vocab().pieces.size()));
  EXPECT_EQ(tok->Encode("hello world", true),
            (std::vector<TokenId>{kBos, h.space_hello, h.space_w, h.orr, h.ld, kEos}));
  EXPECT_EQ(tok->Encode("\xC3\xA9", false),
            (std::vector<TokenId>{h.marker, ByteId(0xC3), ByteId(0xA9)}));
  EXPECT_TRUE(tok->IsControl(kBos));
}

TEST(TokenizerGgufTest, DefaultsWhenOptionalKeysAreAbsent) {
  HelloVocab h;
  GgufWriter w;
  w.String("tokenizer.ggml.model", "llama");
  w.Strings("tokenizer.ggml.tokens", h.vocab.vocab().pieces);
  const std::string bytes = w.Finish();
  StatusOr<gguf::GgufFile> file = gguf::GgufFile::Parse(bytes.data(), bytes.size());
  ASSERT_TRUE(file.ok()) << file.status().message();
  StatusOr<Tokenizer> tok = Tokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_TRUE(tok->add_bos());
  // No add_eos by default; the space prefix is on.
  const std::vector<TokenId> ids = tok->Encode("hello", true);
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids.front(), kBos);
  EXPECT_NE(ids.back(), kEos);
  // Without token types <s> is an ordinary piece, so decode only what follows it.
  EXPECT_EQ(tok->Decode({ids.begin() + 1, ids.end()}, /*strip_leading_space=*/false), " hello");
}

TEST(TokenizerGgufTest, RejectsOtherTokenizerModels) {
  HelloVocab h;
  GgufWriter w;
  w.String("tokenizer.ggml.model", "rwkv");
  WriteHelloVocab(w, h, /*with_model=*/false);
  const std::string error = FromGgufError(w.Finish());
  EXPECT_NE(error.find("tokenizer.ggml.model"), std::string::npos) << error;
  EXPECT_NE(error.find("\"llama\""), std::string::npos) << error;
  EXPECT_NE(error.find("rwkv"), std::string::npos) << error;
}

TEST(TokenizerGgufTest, ErrorsNameTheKey) {
  HelloVocab h;
  {
    GgufWriter w;
    WriteHelloVocab(w, h, /*with_model=*/false);
    const std::string error = FromGgufError(w.Finish());
    EXPECT_NE(error.find("tokenizer.ggml.model"), std::string::npos) << error;
  }
  {
    GgufWriter w;
    WriteHelloVocab(w, h, /*with_model=*/true, /*with_tokens=*/false);
    const std::string error = FromGgufError(w.Finish());
    EXPECT_NE(error.find("tokenizer.ggml.tokens"), std::string::npos) << error;
  }
  {
    GgufWriter w;
    WriteHelloVocab(w, h);
    w.Uint32("tokenizer.ggml.bos_token_id", 100000);
    const std::string error = FromGgufError(w.Finish());
    EXPECT_NE(error.find("tokenizer.ggml.bos_token_id"), std::string::npos) << error;
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "llama");
    w.Strings("tokenizer.ggml.tokens", h.vocab.vocab().pieces);
    w.Floats("tokenizer.ggml.scores", {1.0f, 2.0f});
    const std::string error = FromGgufError(w.Finish());
    EXPECT_NE(error.find("tokenizer.ggml.scores"), std::string::npos) << error;
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "llama");
    w.Strings("tokenizer.ggml.tokens", h.vocab.vocab().pieces);
    w.Strings("tokenizer.ggml.token_type", {"normal"});
    const std::string error = FromGgufError(w.Finish());
    EXPECT_NE(error.find("tokenizer.ggml.token_type"), std::string::npos) << error;
  }
  {
    GgufWriter w;
    w.String("tokenizer.ggml.model", "llama");
    w.Strings("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "a", "a"});
    const std::string error = FromGgufError(w.Finish());
    EXPECT_NE(error.find("tokenizer.ggml.tokens"), std::string::npos) << error;
  }
}

// A byte-level BPE vocabulary as GGUF metadata: the 256 byte characters, "Ġw" from its merge,
// and the chat tokens of a Llama 3 vocabulary.
void WriteByteLevelVocab(GgufWriter& w, bool with_merges = true) {
  std::vector<std::string> pieces;
  for (int b = 0; b < 256; ++b) {
    std::string piece;
    AppendByteEncoded(std::string(1, static_cast<char>(b)), &piece);
    pieces.push_back(piece);
  }
  pieces.push_back("\xC4\xA0w");  // Ġw, id 256
  pieces.push_back("<|begin_of_text|>");
  pieces.push_back("<|end_of_text|>");
  pieces.push_back("<|eot_id|>");
  std::vector<int32_t> types(pieces.size(), static_cast<int32_t>(TokenType::kNormal));
  types[257] = types[258] = types[259] = static_cast<int32_t>(TokenType::kControl);
  w.String("tokenizer.ggml.model", "gpt2");
  w.Strings("tokenizer.ggml.tokens", pieces);
  w.Int32s("tokenizer.ggml.token_type", types);
  if (with_merges) w.Strings("tokenizer.ggml.merges", {"\xC4\xA0 w"});
  w.Uint32("tokenizer.ggml.bos_token_id", 257);
  w.Uint32("tokenizer.ggml.eos_token_id", 258);
}

StatusOr<Tokenizer> LoadTokenizer(const std::string& bytes) {
  StatusOr<gguf::GgufFile> file = gguf::GgufFile::Parse(bytes.data(), bytes.size());
  if (!file.ok()) return file.status();
  return Tokenizer::FromGguf(*file);
}

TEST(TokenizerGgufTest, LoadsAByteLevelBpeVocabulary) {
  GgufWriter w;
  WriteByteLevelVocab(w);
  w.String("tokenizer.ggml.pre", "llama-bpe");
  const std::string bytes = w.Finish();
  StatusOr<Tokenizer> tok = LoadTokenizer(bytes);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  // Llama 3 adds BOS by default; its end-of-turn token ends generation besides eos.
  EXPECT_TRUE(tok->add_bos());
  EXPECT_EQ(tok->Encode("a w", true), (std::vector<TokenId>{257, 'a', 256}));
  EXPECT_TRUE(tok->IsEog(258));
  EXPECT_TRUE(tok->IsEog(259));
  EXPECT_EQ(tok->Decode({257, 'a', 256, 259}), "a w");
}

TEST(TokenizerGgufTest, BpeDefaults) {
  GgufWriter w;
  WriteByteLevelVocab(w);
  w.String("tokenizer.ggml.pre", "gpt-2");
  w.Uint32("tokenizer.ggml.eot_token_id", 'x');
  const std::string bytes = w.Finish();
  StatusOr<Tokenizer> tok = LoadTokenizer(bytes);
  ASSERT_TRUE(tok.ok()) << tok.status().message();
  EXPECT_FALSE(tok->add_bos());
  EXPECT_EQ(tok->Encode("a w", true), (std::vector<TokenId>{'a', 256}));
  EXPECT_TRUE(tok->IsEog('x'));
}

TEST(TokenizerGgufTest, PreTokenizerFallbacks) {
  // Unknown names get GPT-2's pattern; a missing key llama.cpp's default (which splits
  // punctuation off first).
  GgufWriter unknown;
  WriteByteLevelVocab(unknown);
  unknown.String("tokenizer.ggml.pre", "some-future-model");
  const std::string unknown_bytes = unknown.Finish();
  StatusOr<Tokenizer> gpt2 = LoadTokenizer(unknown_bytes);
  ASSERT_TRUE(gpt2.ok()) << gpt2.status().message();
  EXPECT_EQ(gpt2->Encode("a w", false), (std::vector<TokenId>{'a', 256}));

  GgufWriter missing;
  WriteByteLevelVocab(missing);
  const std::string missing_bytes = missing.Finish();
  StatusOr<Tokenizer> by_default = LoadTokenizer(missing_bytes);
  ASSERT_TRUE(by_default.ok()) << by_default.status().message();
  EXPECT_EQ(by_default->Encode("a w", false), (std::vector<TokenId>{'a', 256}));
}

TEST(TokenizerGgufTest, BpeNeedsMerges) {
  GgufWriter w;
  WriteByteLevelVocab(w, /*with_merges=*/false);
  const std::string error = FromGgufError(w.Finish());
  EXPECT_NE(error.find("tokenizer.ggml.merges"), std::string::npos) << error;
}

}  // namespace
}  // namespace kvllm
