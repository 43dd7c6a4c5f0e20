#include "tokenizer/vocab.h"

#include <string_view>

namespace kvllm {

bool IsTextPiece(TokenType type) {
  return type == TokenType::kNormal || type == TokenType::kUserDefined ||
         type == TokenType::kUndefined;
}

int ParseByteToken(std::string_view piece) {
  if (piece.size() != 6 || piece.substr(0, 3) != "<0x" || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9') {
      digit = c - '0';
    } else if (c >= 'A' && c <= 'F') {
      digit = c - 'A' + 10;
    } else if (c >= 'a' && c <= 'f') {
      digit = c - 'a' + 10;
    } else {
      return -1;
    }
    value = value * 16 + digit;
  }
  return value;
}

}  // namespace kvllm
