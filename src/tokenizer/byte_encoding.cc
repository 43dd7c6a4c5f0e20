#include "tokenizer/byte_encoding.h"

#include <array>
#include <cstdint>
#include <string>
#include <string_view>

#include "tokenizer/utf8.h"

namespace kvllm {
namespace {

constexpr bool StandsForItself(int byte) {
  return (byte >= 0x21 && byte <= 0x7E) || (byte >= 0xA1 && byte <= 0xAC) ||
         (byte >= 0xAE && byte <= 0xFF);
}

constexpr std::array<char32_t, 256> MakeByteToCodePoint() {
  std::array<char32_t, 256> table{};
  char32_t next = 0x100;
  for (int byte = 0; byte < 256; ++byte) {
    table[byte] = StandsForItself(byte) ? static_cast<char32_t>(byte) : next++;
  }
  return table;
}

constexpr std::array<char32_t, 256> kByteToCodePoint = MakeByteToCodePoint();

// Every code point in the mapping is below U+0144 (256 + 68).
constexpr char32_t kCodePointLimit = 0x144;

constexpr std::array<int16_t, kCodePointLimit> MakeCodePointToByte() {
  std::array<int16_t, kCodePointLimit> table{};
  for (auto& entry : table) entry = -1;
  for (int byte = 0; byte < 256; ++byte) table[kByteToCodePoint[byte]] = byte;
  return table;
}

constexpr std::array<int16_t, kCodePointLimit> kCodePointToByte = MakeCodePointToByte();

}  // namespace

char32_t ByteToCodePoint(uint8_t byte) { return kByteToCodePoint[byte]; }

int CodePointToByte(char32_t cp) { return cp < kCodePointLimit ? kCodePointToByte[cp] : -1; }

void AppendByteEncoded(std::string_view bytes, std::string* out) {
  for (char c : bytes) AppendUtf8(kByteToCodePoint[static_cast<uint8_t>(c)], out);
}

std::string DecodeByteEncoded(std::string_view piece) {
  std::string out;
  out.reserve(piece.size());
  while (!piece.empty()) {
    const Utf8Scan scan = ScanUtf8(piece);
    const size_t length = scan.kind == Utf8Scan::kValid ? scan.length : 1;
    const int byte = scan.kind == Utf8Scan::kValid ? CodePointToByte(DecodeUtf8(piece, length))
                                                   : -1;
    if (byte >= 0) {
      out.push_back(static_cast<char>(byte));
    } else {
      out.append(piece.substr(0, length));
    }
    piece.remove_prefix(length);
  }
  return out;
}

}  // namespace kvllm
