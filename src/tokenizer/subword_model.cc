#include "tokenizer/subword_model.h"

namespace kvllm {

PieceMap MakeTextPieceMap(const Vocab& vocab) {
  PieceMap map;
  map.reserve(vocab.pieces.size());
  for (size_t i = 0; i < vocab.pieces.size(); ++i) {
    if (IsTextPiece(vocab.types[i]) && !vocab.pieces[i].empty()) {
      map.emplace(vocab.pieces[i], static_cast<TokenId>(i));
    }
  }
  return map;
}

}  // namespace kvllm
