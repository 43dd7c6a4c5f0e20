// GPT-2's byte-to-unicode mapping, used by byte-level BPE vocabularies: every byte stands for
// one printable code point, so that any byte string is a string of visible characters and a
// vocabulary of such strings covers all input. Printable Latin-1 bytes (0x21-0x7E, 0xA1-0xAC,
// 0xAE-0xFF) stand for themselves; the other 68 bytes, in increasing order, for U+0100
// onwards (so ' ' is 'Ġ' U+0120 and '\n' is 'Ċ' U+010A).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

namespace kvllm {

// The code point that stands for `byte`.
char32_t ByteToCodePoint(uint8_t byte);

// The byte that `cp` stands for, or -1 when `cp` stands for none.
int CodePointToByte(char32_t cp);

// Appends the UTF-8 of the code point of each byte of `bytes`.
void AppendByteEncoded(std::string_view bytes, std::string* out);

// The bytes a byte-level token stands for. A character that stands for no byte (possible in
// tokens a converter added by hand) is kept as its own UTF-8, so nothing is lost.
std::string DecodeByteEncoded(std::string_view piece);

}  // namespace kvllm
