#include "tokenizer/byte_encoding.h"

#include <set>
#include <string>

#include <gtest/gtest.h>

namespace kvllm {
namespace {

TEST(ByteEncodingTest, KnownCharacters) {
  EXPECT_EQ(ByteToCodePoint('a'), U'a');
  EXPECT_EQ(ByteToCodePoint('!'), U'!');
  EXPECT_EQ(ByteToCodePoint(0xE9), U'\xE9');   // é stands for itself
  EXPECT_EQ(ByteToCodePoint(0x00), U'\u0100');  // the first byte that does not
  EXPECT_EQ(ByteToCodePoint('\n'), U'\u010A');  // Ċ
  EXPECT_EQ(ByteToCodePoint(' '), U'\u0120');   // Ġ
  EXPECT_EQ(ByteToCodePoint(0x7F), U'\u0121');
  EXPECT_EQ(ByteToCodePoint(0xAD), U'\u0143');  // soft hyphen, the last of the 68
}

TEST(ByteEncodingTest, RoundTripsEveryByte) {
  std::set<char32_t> seen;
  for (int byte = 0; byte < 256; ++byte) {
    const char32_t cp = ByteToCodePoint(static_cast<uint8_t>(byte));
    EXPECT_TRUE(seen.insert(cp).second) << "byte " << byte << " shares its code point";
    EXPECT_EQ(CodePointToByte(cp), byte);
  }
  EXPECT_EQ(CodePointToByte(U' '), -1);  // spelled Ġ, so ' ' itself stands for nothing
  EXPECT_EQ(CodePointToByte(U'\u0144'), -1);
  EXPECT_EQ(CodePointToByte(U'\u4E2D'), -1);
}

TEST(ByteEncodingTest, EncodesAndDecodesText) {
  std::string all_bytes;
  for (int byte = 0; byte < 256; ++byte) all_bytes.push_back(static_cast<char>(byte));
  std::string encoded;
  AppendByteEncoded(all_bytes, &encoded);
  EXPECT_EQ(DecodeByteEncoded(encoded), all_bytes);

  encoded.clear();
  AppendByteEncoded(" Hello\n", &encoded);
  EXPECT_EQ(encoded, "\xC4\xA0Hello\xC4\x8A");  // ĠHelloĊ
  // "é" is C3 A9: both bytes stand for themselves, as Ã and ©.
  encoded.clear();
  AppendByteEncoded("\xC3\xA9", &encoded);
  EXPECT_EQ(encoded, "\xC3\x83\xC2\xA9");
}

TEST(ByteEncodingTest, KeepsCharactersThatStandForNoByte) {
  // A hand-added token may hold characters outside the mapping (and even invalid UTF-8).
  EXPECT_EQ(DecodeByteEncoded("a \xE4\xB8\xAD\xC4\xA0"), "a \xE4\xB8\xAD ");
  EXPECT_EQ(DecodeByteEncoded("\xFF"), "\xFF");
}

}  // namespace
}  // namespace kvllm
