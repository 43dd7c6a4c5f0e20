// Reading a Vocab from a GGUF file's tokenizer.ggml.* metadata, with llama.cpp's defaults for
// whatever a file leaves out.
#pragma once

#include "base/status.h"
#include "gguf/gguf_file.h"
#include "tokenizer/vocab.h"

namespace kvllm {

// Reads tokenizer.ggml.{model,pre,tokens,scores,token_type,merges,bos_token_id,eos_token_id,
// unknown_token_id,eot_token_id,eom_token_id,add_bos_token,add_eos_token,add_space_prefix}.
// Models: "llama" (SentencePiece), "gpt2" (byte-level BPE) and "gemma4" (BPE over UTF-8).
// A "gpt2" file without tokenizer.ggml.pre gets PreTokenizer::kDefault, as in llama.cpp (such
// files predate the key); a `pre` kvllm does not know gets kGpt2, the pattern most others
// refine, rather than an error, so that a new model family still loads.
StatusOr<Vocab> ReadVocabFromGguf(const gguf::GgufFile& file);

}  // namespace kvllm
