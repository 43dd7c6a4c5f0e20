#include "tokenizer/pre_tokenizer.h"

#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "tokenizer/unicode_categories.h"

namespace kvllm {
namespace {

using Words = std::vector<std::string>;

// The words as strings, after checking that they tile the text exactly.
Words Split(PreTokenizer kind, std::string_view text) {
  const std::vector<std::string_view> views = PreTokenize(kind, text);
  Words words(views.begin(), views.end());
  std::string joined;
  for (const std::string& w : words) {
    EXPECT_FALSE(w.empty());
    joined += w;
  }
  EXPECT_EQ(joined, text);
  return words;
}

TEST(UnicodeCategoriesTest, ClassifiesCodePoints) {
  EXPECT_TRUE(ClassifyCodePoint('a').IsLetter());
  EXPECT_TRUE(ClassifyCodePoint(0x4E2D).IsLetter());   // 中
  EXPECT_TRUE(ClassifyCodePoint(0x0416).IsLetter());   // Ж
  EXPECT_TRUE(ClassifyCodePoint('7').IsNumber());
  EXPECT_TRUE(ClassifyCodePoint(0x00BD).IsNumber());   // ½
  EXPECT_TRUE(ClassifyCodePoint(0x0663).IsNumber());   // Arabic-Indic 3
  EXPECT_TRUE(ClassifyCodePoint(0x0301).IsMark());     // combining acute
  EXPECT_TRUE(ClassifyCodePoint(',').IsPunctuation());
  EXPECT_TRUE(ClassifyCodePoint(0x3002).IsPunctuation());  // 。
  EXPECT_EQ(ClassifyCodePoint('$').category, UnicodeCategory::kSymbol);
  EXPECT_EQ(ClassifyCodePoint(0x1F999).category, UnicodeCategory::kSymbol);  // 🦙
  EXPECT_EQ(ClassifyCodePoint(0x200D).category, UnicodeCategory::kControl);  // ZWJ (Cf)
  EXPECT_EQ(ClassifyCodePoint(0x0378).category, UnicodeCategory::kUnassigned);
  EXPECT_EQ(ClassifyCodePoint(0x110000).category, UnicodeCategory::kUnassigned);
  // \s is the White_Space property: not U+001C..U+001F, which str.isspace() counts.
  for (char32_t cp : {U' ', U'\t', U'\n', U'\v', U'\f', U'\r', U'\x85', U'\xA0', U'\u3000',
                      U'\u2028'}) {
    EXPECT_TRUE(ClassifyCodePoint(cp).whitespace) << static_cast<uint32_t>(cp);
  }
  EXPECT_FALSE(ClassifyCodePoint(0x1C).whitespace);
  EXPECT_FALSE(ClassifyCodePoint(0x200B).whitespace);  // zero width space is Cf
}

TEST(PreTokenizerTest, EmptyTextHasNoWords) {
  EXPECT_TRUE(PreTokenize(PreTokenizer::kLlama3, "").empty());
}

TEST(PreTokenizerTest, Gpt2Words) {
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "Hello world"), (Words{"Hello", " world"}));
  // Contractions are case-sensitive.
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "I'm don't 'RE"),
            (Words{"I", "'m", " don", "'t", " '", "RE"}));
  EXPECT_EQ(Split(PreTokenizer::kGpt2, " 12345 x"), (Words{" 12345", " x"}));
}

TEST(PreTokenizerTest, Gpt2Whitespace) {
  // A run of whitespace leaves its last space to the word after it...
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "a   b"), (Words{"a", "  ", " b"}));
  // ...but keeps all of it at the end of the text.
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "a  "), (Words{"a", "  "}));
  // Only a space joins a word: a newline before one stands alone.
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "a\n\nb"), (Words{"a", "\n", "\n", "b"}));
  // No-break space is whitespace, but not the space that prefixes words.
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "a\u00A0b"), (Words{"a", "\u00A0", "b"}));
}

TEST(PreTokenizerTest, InvalidUtf8BytesAreSymbols) {
  EXPECT_EQ(Split(PreTokenizer::kGpt2, "a\xFF" "b"), (Words{"a", "\xFF", "b"}));
  EXPECT_EQ(Split(PreTokenizer::kLlama3, "x \xE2\x82"), (Words{"x", " \xE2\x82"}));
}

TEST(PreTokenizerTest, Llama3Contractions) {
  // Case-insensitive; a quote that starts none joins what follows it.
  EXPECT_EQ(Split(PreTokenizer::kLlama3, "'RE 'Ve a'lL"),
            (Words{"'RE", " '", "Ve", " a", "'lL"}));
}

TEST(PreTokenizerTest, Llama3DigitGroups) {
  EXPECT_EQ(Split(PreTokenizer::kLlama3, "1234567"), (Words{"123", "456", "7"}));
  EXPECT_EQ(Split(PreTokenizer::kQwen2, "v2024"), (Words{"v", "2", "0", "2", "4"}));
}

TEST(PreTokenizerTest, Llama3WhitespaceAndNewlines) {
  // Whitespace up to the last newline is one word.
  EXPECT_EQ(Split(PreTokenizer::kLlama3, "a  \n\n b"), (Words{"a", "  \n\n", " b"}));
  // Newlines after punctuation join it; a tab may prefix a word.
  EXPECT_EQ(Split(PreTokenizer::kLlama3, "\tHello!!\n\nx"), (Words{"\tHello", "!!\n\n", "x"}));
}

TEST(PreTokenizerTest, Llama3CjkAndEmoji) {
  // CJK characters are letters, so they run on with Latin ones.
  EXPECT_EQ(Split(PreTokenizer::kLlama3, "我想在apple工作"), (Words{"我想在apple工作"}));
  // An emoji is a symbol: it takes the space before it and the punctuation after.
  EXPECT_EQ(Split(PreTokenizer::kLlama3, " this is 🦙.cpp"),
            (Words{" this", " is", " 🦙.", "cpp"}));
}

TEST(PreTokenizerTest, Qwen35MarksJoinLetters) {
  const std::string viet = "Vie\u0302\u0301t Nam";  // ê with a combining accent
  EXPECT_EQ(Split(PreTokenizer::kQwen35, viet), (Words{"Vie\u0302\u0301t", " Nam"}));
  EXPECT_EQ(Split(PreTokenizer::kQwen2, viet), (Words{"Vie", "\u0302\u0301", "t", " Nam"}));
}

TEST(PreTokenizerTest, StarCoderSplitsEveryDigit) {
  EXPECT_EQ(Split(PreTokenizer::kStarCoder, "x = 123"), (Words{"x", " =", " ", "1", "2", "3"}));
}

TEST(PreTokenizerTest, FalconAndDefaultSplitPunctuationAndDigitTriples) {
  EXPECT_EQ(Split(PreTokenizer::kFalcon, "a,b 1234 `x`"),
            (Words{"a", ",", "b", " ", "123", "4", " ", "`", "x", "`"}));
  EXPECT_EQ(Split(PreTokenizer::kDefault, "a,b 1234567 x"),
            (Words{"a", ",", "b", " ", "123", "456", "7", " x"}));
}

TEST(PreTokenizerTest, DeepSeek) {
  EXPECT_EQ(Split(PreTokenizer::kDeepSeekLlm, "我想在apple工作 1314"),
            (Words{"我想在", "apple", "工作", " ", "1314"}));
  EXPECT_EQ(Split(PreTokenizer::kDeepSeekLlm, "Hello!  \n"), (Words{"Hello", "!", "  ", "\n"}));
  EXPECT_EQ(Split(PreTokenizer::kDeepSeekCoder, "foo(1, 23)\n"),
            (Words{"foo", "(", "1", ",", " ", "2", "3", ")", "\n"}));
}

TEST(PreTokenizerTest, Bloom) {
  EXPECT_EQ(Split(PreTokenizer::kBloom, "Hello, world. (ok) "),
            (Words{"Hello", ",", " world", ". (", "ok", ") "}));
}

TEST(PreTokenizerTest, NewlineRuns) {
  EXPECT_EQ(Split(PreTokenizer::kNewlines, "a\u2581b\n\n\nc"), (Words{"a\u2581b", "\n\n\n", "c"}));
}

TEST(PreTokenizerTest, WordsTileAnyText) {
  const std::string texts[] = {
      "\n \n\n \n\n\n \t \t\t \t\n  \n   \n    \n     \n",
      "🚀 (normal) 😶\u200d🌫️ ✅ 🦙🦙 3 33 3.3 3..3 កាន់តែពិសេសអាច😁 ?我想在apple工作1314151天～",
      "------======= нещо на Български ''''''```````\"\"\"\"......!!!!!!??????",
      std::string("nul\0byte \xC0\xAF \xED\xA0\x80", 15),
  };
  for (PreTokenizer kind :
       {PreTokenizer::kDefault, PreTokenizer::kGpt2, PreTokenizer::kLlama3, PreTokenizer::kQwen2,
        PreTokenizer::kQwen35, PreTokenizer::kStarCoder, PreTokenizer::kFalcon,
        PreTokenizer::kDeepSeekLlm, PreTokenizer::kDeepSeekCoder, PreTokenizer::kBloom,
        PreTokenizer::kNewlines}) {
    for (const std::string& text : texts) Split(kind, text);
  }
}

}  // namespace
}  // namespace kvllm
