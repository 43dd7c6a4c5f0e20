#include "tokenizer/utf8.h"

#include <cstdint>
#include <string>
#include <string_view>

namespace kvllm {
namespace {

constexpr std::string_view kReplacementChar = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

Utf8Scan ScanUtf8(std::string_view bytes) {
  if (bytes.empty()) return {Utf8Scan::kIncomplete, 0};
  const auto lead = static_cast<uint8_t>(bytes[0]);
  if (lead < 0x80) return {Utf8Scan::kValid, 1};
  // The allowed range of the second byte depends on the lead (Unicode Table 3-7); this is
  // what rules out overlong forms, surrogates and code points past U+10FFFF.
  size_t length = 0;
  uint8_t second_lo = 0x80, second_hi = 0xBF;
  if (lead >= 0xC2 && lead <= 0xDF) {
    length = 2;
  } else if (lead == 0xE0) {
    length = 3;
    second_lo = 0xA0;
  } else if (lead == 0xED) {
    length = 3;
    second_hi = 0x9F;
  } else if (lead >= 0xE1 && lead <= 0xEF) {
    length = 3;
  } else if (lead == 0xF0) {
    length = 4;
    second_lo = 0x90;
  } else if (lead >= 0xF1 && lead <= 0xF3) {
    length = 4;
  } else if (lead == 0xF4) {
    length = 4;
    second_hi = 0x8F;
  } else {
    return {Utf8Scan::kInvalid, 1};
  }
  for (size_t i = 1; i < length; ++i) {
    if (i >= bytes.size()) return {Utf8Scan::kIncomplete, bytes.size()};
    const auto byte = static_cast<uint8_t>(bytes[i]);
    const uint8_t lo = i == 1 ? second_lo : 0x80;
    const uint8_t hi = i == 1 ? second_hi : 0xBF;
    if (byte < lo || byte > hi) return {Utf8Scan::kInvalid, i};
  }
  return {Utf8Scan::kValid, length};
}

char32_t DecodeUtf8(std::string_view bytes, size_t length) {
  const auto lead = static_cast<uint8_t>(bytes[0]);
  if (length == 1) return lead;
  // The lead keeps 7 - length payload bits; each continuation byte adds 6.
  char32_t cp = lead & (0x7F >> length);
  for (size_t i = 1; i < length; ++i) cp = (cp << 6) | (static_cast<uint8_t>(bytes[i]) & 0x3F);
  return cp;
}

void AppendUtf8(char32_t cp, std::string* out) {
  if (cp < 0x80) {
    out->push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

std::string Utf8Streamer::Push(std::string_view piece) {
  pending_.append(piece);
  std::string out;
  std::string_view rest = pending_;
  while (!rest.empty()) {
    const Utf8Scan scan = ScanUtf8(rest);
    if (scan.kind == Utf8Scan::kIncomplete) break;  // a later piece may complete it
    if (scan.kind == Utf8Scan::kValid) {
      out.append(rest.substr(0, scan.length));
    } else {
      out.append(kReplacementChar);
    }
    rest.remove_prefix(scan.length);
  }
  pending_.erase(0, pending_.size() - rest.size());
  return out;
}

std::string Utf8Streamer::Flush() {
  // Whatever is held is an unfinished character; with no more input it can never complete.
  std::string out = pending_.empty() ? std::string() : std::string(kReplacementChar);
  pending_.clear();
  return out;
}

}  // namespace kvllm
