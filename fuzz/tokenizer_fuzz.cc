// Fuzzes the tokenizer with arbitrary bytes (invalid UTF-8 included) through four vocabularies:
// the bundled model's SentencePiece vocabulary (byte fallback), a byte-level BPE vocabulary
// with every pre-tokenizer, and a Gemma-4-style BPE (raw UTF-8, '▁' for spaces, <0xNN>
// fallback). The invariants checked are the ones the tokenizer guarantees:
//   - every id Encode gives is in the vocabulary;
//   - Decode(Encode(text)) == text whenever every byte can be spelled: byte fallback or byte-
//     level pieces, no '▁' in the text where '▁' stands for a space, and no user-defined token
//     text in it (those are matched verbatim and may decode alike from different spellings);
//   - PreTokenize cuts text into pieces whose concatenation is the text;
//   - ScanUtf8 agrees with an independent validator, and Utf8Streamer only emits valid UTF-8,
//     equal to the input or the decoded text whenever that is valid.
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "gguf/gguf_file.h"
#include "tokenizer/byte_encoding.h"
#include "tokenizer/pre_tokenizer.h"
#include "tokenizer/tokenizer.h"
#include "tokenizer/utf8.h"
#include "tokenizer/vocab_gguf.h"

namespace kvllm::fuzz {
namespace {

constexpr std::string_view kSpaceMarker = "\xE2\x96\x81";  // U+2581

constexpr PreTokenizer kPreTokenizers[] = {
    PreTokenizer::kDefault,     PreTokenizer::kGpt2,          PreTokenizer::kLlama3,
    PreTokenizer::kQwen2,       PreTokenizer::kQwen35,        PreTokenizer::kStarCoder,
    PreTokenizer::kFalcon,      PreTokenizer::kDeepSeekLlm,   PreTokenizer::kDeepSeekCoder,
    PreTokenizer::kBloom,       PreTokenizer::kNewlines,
};

struct Subject {
  std::string name;
  Tokenizer tokenizer;
  std::vector<std::string> user_defined;  // texts matched verbatim
  bool space_marker = false;              // '▁' in text decodes as a space
};

std::vector<Subject>* subjects = nullptr;

Tokenizer Build(Vocab vocab, const char* name) {
  StatusOr<Tokenizer> tok = Tokenizer::FromVocab(std::move(vocab));
  FUZZ_CHECK(tok.ok(), std::string(name) + ": " + tok.status().message());
  return std::move(*tok);
}

std::vector<std::string> UserDefined(const Vocab& vocab) {
  std::vector<std::string> out;
  for (size_t i = 0; i < vocab.types.size(); ++i) {
    if (vocab.types[i] == TokenType::kUserDefined) out.push_back(vocab.pieces[i]);
  }
  return out;
}

std::string ByteLevel(std::string_view raw) {
  std::string out;
  AppendByteEncoded(raw, &out);
  return out;
}

// Byte-level BPE: the 256 byte pieces, a few merges, an end-of-text control token and a
// user-defined token.
Vocab ByteLevelVocab(PreTokenizer pre) {
  Vocab v;
  v.kind = TokenizerKind::kBpe;
  v.pre = pre;
  v.add_bos = false;
  v.add_space_prefix = false;
  v.unk = kNoToken;
  for (int b = 0; b < 256; ++b) v.pieces.push_back(ByteLevel(std::string(1, char(b))));
  const char* merges[][2] = {{"t", "h"}, {"th", "e"}, {" ", "th"}, {" th", "e"}, {"i", "n"},
                             {" ", "a"}, {"e", "r"}, {"\xC3", "\xA9"}, {"1", "2"}, {"'", "s"}};
  for (const auto& [left, right] : merges) {
    v.merges.push_back(ByteLevel(left) + " " + ByteLevel(right));
    v.pieces.push_back(ByteLevel(std::string(left) + right));
  }
  v.types.assign(v.pieces.size(), TokenType::kNormal);
  v.pieces.push_back("<|endoftext|>");
  v.types.push_back(TokenType::kControl);
  v.pieces.push_back("<|user|>");
  v.types.push_back(TokenType::kUserDefined);
  v.bos = v.eos = static_cast<TokenId>(v.pieces.size() - 2);
  return v;
}

// Gemma-4-style BPE: raw UTF-8 pieces, '▁' for spaces, <0xNN> byte tokens.
Vocab NewlinesVocab() {
  Vocab v;
  v.kind = TokenizerKind::kBpe;
  v.pre = PreTokenizer::kNewlines;
  v.add_bos = false;
  v.add_space_prefix = false;
  v.bos = v.eos = v.unk = kNoToken;
  char hex[8];
  for (int b = 0; b < 256; ++b) {
    std::snprintf(hex, sizeof hex, "<0x%02X>", b);
    v.pieces.push_back(hex);
    v.types.push_back(TokenType::kByte);
  }
  for (const char* piece : {"\xE2\x96\x81", "a", "b", "ab", "\xE2\x96\x81" "a", "\n", "\n\n"}) {
    v.pieces.push_back(piece);
    v.types.push_back(TokenType::kNormal);
  }
  v.merges = {"a b", "\xE2\x96\x81 a", "\n \n"};
  return v;
}

bool ContainsAny(std::string_view text, const std::vector<std::string>& needles) {
  for (const std::string& n : needles) {
    if (text.find(n) != std::string_view::npos) return true;
  }
  return false;
}

void CheckStreamer(const std::vector<std::string>& pieces, const std::string& whole) {
  Utf8Streamer streamer;
  std::string out;
  for (const std::string& p : pieces) {
    const std::string chunk = streamer.Push(p);
    FUZZ_CHECK(IsValidUtf8(chunk), "Utf8Streamer::Push emitted invalid UTF-8");
    out += chunk;
  }
  const std::string tail = streamer.Flush();
  FUZZ_CHECK(IsValidUtf8(tail), "Utf8Streamer::Flush emitted invalid UTF-8");
  out += tail;
  if (IsValidUtf8(whole)) FUZZ_CHECK(out == whole, "Utf8Streamer changed valid text");
}

void CheckScan(std::string_view text) {
  bool all_valid = true;
  for (size_t pos = 0; pos < text.size();) {
    const Utf8Scan scan = ScanUtf8(text.substr(pos));
    FUZZ_CHECK(scan.length >= 1 && scan.length <= text.size() - pos, "ScanUtf8 length");
    if (scan.kind == Utf8Scan::kValid) {
      FUZZ_CHECK(IsValidUtf8(text.substr(pos, scan.length)), "ScanUtf8 accepted invalid bytes");
      std::string again;
      AppendUtf8(DecodeUtf8(text.substr(pos), scan.length), &again);
      FUZZ_CHECK(again == text.substr(pos, scan.length), "DecodeUtf8/AppendUtf8 round trip");
    } else {
      all_valid = false;
    }
    pos += scan.length;
  }
  FUZZ_CHECK(all_valid == IsValidUtf8(text), "ScanUtf8 and the validator disagree");
}

}  // namespace
}  // namespace kvllm::fuzz

extern "C" int LLVMFuzzerInitialize(int* /*argc*/, char*** /*argv*/) {
  using namespace kvllm;
  using namespace kvllm::fuzz;
  subjects = new std::vector<Subject>;
  const std::string path = std::string(KVLLM_SOURCE_DIR) + "/models/kvllm-prose.gguf";
  StatusOr<gguf::GgufFile> file = gguf::GgufFile::Open(path);
  FUZZ_CHECK(file.ok(), file.status().message());
  StatusOr<Vocab> prose = ReadVocabFromGguf(*file);
  FUZZ_CHECK(prose.ok(), prose.status().message());
  subjects->push_back({"kvllm-prose", Build(*prose, "kvllm-prose"), UserDefined(*prose), true});
  for (PreTokenizer pre : kPreTokenizers) {
    if (pre == PreTokenizer::kNewlines) continue;
    const Vocab v = ByteLevelVocab(pre);
    subjects->push_back({"byte-level", Build(v, "byte-level"), UserDefined(v), false});
  }
  const Vocab v = NewlinesVocab();
  subjects->push_back({"newlines", Build(v, "newlines"), UserDefined(v), true});
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvllm;
  using namespace kvllm::fuzz;
  if (size == 0) return 0;
  const uint8_t selector = data[0];
  const std::string_view text(reinterpret_cast<const char*>(data + 1), size - 1);

  CheckScan(text);
  const PreTokenizer pre = kPreTokenizers[selector % std::size(kPreTokenizers)];
  std::string joined;
  for (std::string_view piece : PreTokenize(pre, text)) {
    FUZZ_CHECK(!piece.empty(), "PreTokenize gave an empty piece");
    joined.append(piece);
  }
  FUZZ_CHECK(joined == text, "PreTokenize pieces do not concatenate to the text");

  const Subject& s = (*subjects)[selector % subjects->size()];
  const bool add_special = (selector & 0x40) != 0;
  const bool parse_special = (selector & 0x80) != 0;
  const std::vector<TokenId> ids = s.tokenizer.Encode(text, add_special, parse_special);
  std::vector<std::string> pieces;
  for (TokenId id : ids) {
    FUZZ_CHECK(id >= 0 && id < s.tokenizer.vocab_size(), s.name + ": id " + std::to_string(id));
    pieces.push_back(s.tokenizer.TokenToPiece(id));
  }
  if (!add_special && !parse_special && !ContainsAny(text, s.user_defined) &&
      !(s.space_marker && text.find(kSpaceMarker) != std::string_view::npos)) {
    const std::string decoded = s.tokenizer.Decode(ids);
    FUZZ_CHECK(decoded == text, s.name + ": Decode(Encode(text)) != text (" +
                                    std::to_string(ids.size()) + " ids, " +
                                    std::to_string(decoded.size()) + " bytes decoded)");
  }
  CheckStreamer(pieces, s.tokenizer.Decode(ids, /*strip_leading_space=*/false));

  // Raw input streamed in uneven chunks.
  std::vector<std::string> chunks;
  for (size_t pos = 0, len = 1; pos < text.size(); pos += len, len = len % 5 + 1) {
    chunks.emplace_back(text.substr(pos, len));
  }
  CheckStreamer(chunks, std::string(text));

  // Arbitrary ids, out-of-range ones included.
  std::vector<TokenId> raw_ids;
  for (size_t i = 0; i + 2 <= text.size() && raw_ids.size() < 64; i += 2) {
    raw_ids.push_back(static_cast<int16_t>(uint16_t(text[i]) | uint16_t(text[i + 1]) << 8));
  }
  (void)s.tokenizer.Decode(raw_ids);
  return 0;
}
