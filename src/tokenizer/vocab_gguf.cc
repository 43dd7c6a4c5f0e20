#include "tokenizer/vocab_gguf.h"

#include <algorithm>
#include <string>
#include <string_view>
#include <utility>

namespace kvllm {
namespace {

constexpr std::string_view kModelKey = "tokenizer.ggml.model";
constexpr std::string_view kPreKey = "tokenizer.ggml.pre";
constexpr std::string_view kTokensKey = "tokenizer.ggml.tokens";
constexpr std::string_view kScoresKey = "tokenizer.ggml.scores";
constexpr std::string_view kTypesKey = "tokenizer.ggml.token_type";
constexpr std::string_view kMergesKey = "tokenizer.ggml.merges";

// What a tokenizer.ggml.pre value means (llama.cpp's names for each regex set).
struct PreTokenizerName {
  std::string_view name;
  PreTokenizer pre;
  bool ignore_merges = false;
  bool add_bos = false;  // the default when tokenizer.ggml.add_bos_token is absent
};

constexpr PreTokenizerName kPreTokenizerNames[] = {
    {"default", PreTokenizer::kDefault},
    {"llama3", PreTokenizer::kLlama3, true, true},
    {"llama-v3", PreTokenizer::kLlama3, true, true},
    {"llama-bpe", PreTokenizer::kLlama3, true, true},
    {"falcon3", PreTokenizer::kLlama3, true, true},
    {"falcon-h1", PreTokenizer::kLlama3, true, true},
    {"pixtral", PreTokenizer::kLlama3, true, true},
    {"dbrx", PreTokenizer::kLlama3},
    {"smaug-bpe", PreTokenizer::kLlama3},
    {"qwen2", PreTokenizer::kQwen2},
    {"deepseek-r1-qwen", PreTokenizer::kQwen2},
    {"megrez", PreTokenizer::kQwen2},
    {"stablelm2", PreTokenizer::kQwen2},
    {"hunyuan", PreTokenizer::kQwen2},
    {"grok-2", PreTokenizer::kQwen2},
    {"qwen35", PreTokenizer::kQwen35},
    {"gpt-2", PreTokenizer::kGpt2},
    {"phi-2", PreTokenizer::kGpt2},
    {"mpt", PreTokenizer::kGpt2},
    {"olmo", PreTokenizer::kGpt2},
    {"jais", PreTokenizer::kGpt2},
    {"gigachat", PreTokenizer::kGpt2},
    {"exaone4", PreTokenizer::kGpt2},
    {"trillion", PreTokenizer::kGpt2},
    {"starcoder", PreTokenizer::kStarCoder},
    {"refact", PreTokenizer::kStarCoder},
    {"command-r", PreTokenizer::kStarCoder},
    {"smollm", PreTokenizer::kStarCoder},
    {"codeshell", PreTokenizer::kStarCoder},
    {"exaone", PreTokenizer::kStarCoder},
    {"minerva-7b", PreTokenizer::kStarCoder},
    {"falcon", PreTokenizer::kFalcon},
    {"deepseek-llm", PreTokenizer::kDeepSeekLlm},
    {"deepseek-coder", PreTokenizer::kDeepSeekCoder},
    {"bloom", PreTokenizer::kBloom},
    {"poro-chat", PreTokenizer::kBloom},
    {"gpt3-finnish", PreTokenizer::kBloom},
};

// Texts of tokens that end a turn in chat models whose eos is another token (Llama 3's
// <|eot_id|> next to <|end_of_text|>, ...); GGUF stores one eos, so llama.cpp finds the
// others by text too.
constexpr std::string_view kEndOfTurnTexts[] = {
    "<|eot_id|>",    "<|eom_id|>",        "<|im_end|>",  "<|end|>",
    "<end_of_turn>", "<|endoftext|>",     "<|end_of_text|>",
    "<\xEF\xBD\x9C" "end\xE2\x96\x81" "of\xE2\x96\x81" "sentence\xEF\xBD\x9C>",  // DeepSeek
};

bool IsSignedIntegerType(gguf::ValueType type) {
  using gguf::ValueType;
  return type == ValueType::kInt8 || type == ValueType::kInt16 || type == ValueType::kInt32 ||
         type == ValueType::kInt64;
}

bool IsUnsignedIntegerType(gguf::ValueType type) {
  using gguf::ValueType;
  return type == ValueType::kUint8 || type == ValueType::kUint16 ||
         type == ValueType::kUint32 || type == ValueType::kUint64;
}

// The array stored under `key`, or an error naming the key when it is absent (and required)
// or not an array of `elem` (any integer type when `elem` is an integer type). Returns
// nullptr for an absent optional key.
StatusOr<const gguf::Value*> FindArray(const gguf::GgufFile& file, std::string_view key,
                                        bool required, const char* elem_kind,
                                        bool (*elem_ok)(gguf::ValueType)) {
  const gguf::Value* value = file.Find(key);
  if (value == nullptr) {
    if (required) return Status::Error(std::string(key) + ": missing (required)");
    return static_cast<const gguf::Value*>(nullptr);
  }
  if (value->type != gguf::ValueType::kArray) {
    return Status::Error(std::string(key) + ": expected an array, found " +
                         gguf::ValueTypeName(value->type));
  }
  if (!elem_ok(value->elem_type)) {
    return Status::Error(std::string(key) + ": expected an array of " + elem_kind + ", found " +
                         gguf::ValueTypeName(value->elem_type) + " elements");
  }
  return value;
}

bool IsString(gguf::ValueType type) { return type == gguf::ValueType::kString; }
bool IsFloat(gguf::ValueType type) {
  return type == gguf::ValueType::kFloat32 || type == gguf::ValueType::kFloat64;
}
bool IsInteger(gguf::ValueType type) {
  return IsSignedIntegerType(type) || IsUnsignedIntegerType(type);
}

// Reads the special token id under `key` and checks that it names a token; `fallback` when
// the key is absent.
StatusOr<TokenId> GetTokenId(const gguf::GgufFile& file, std::string_view key,
                             TokenId fallback, size_t n_tokens) {
  if (file.Find(key) == nullptr) return fallback;
  StatusOr<uint64_t> id = file.GetUint(key);
  if (!id.ok()) return id.status();
  if (*id >= n_tokens) {
    return Status::Error(std::string(key) + ": token id " + std::to_string(*id) +
                         " is out of range for a vocabulary of " + std::to_string(n_tokens) +
                         " tokens");
  }
  return static_cast<TokenId>(*id);
}

Status ReadScores(const gguf::GgufFile& file, size_t n, Vocab* vocab) {
  KVLLM_ASSIGN_OR_RETURN(const gguf::Value* scores,
                         FindArray(file, kScoresKey, /*required=*/false, "floats", IsFloat));
  if (scores == nullptr) return Status::Ok();
  if (scores->array.size() != n) {
    return Status::Error(std::string(kScoresKey) + ": " + std::to_string(scores->array.size()) +
                         " scores for " + std::to_string(n) + " tokens");
  }
  vocab->scores.reserve(n);
  for (const gguf::Value& score : scores->array) {
    vocab->scores.push_back(static_cast<float>(score.f));
  }
  return Status::Ok();
}

Status ReadTypes(const gguf::GgufFile& file, size_t n, Vocab* vocab) {
  KVLLM_ASSIGN_OR_RETURN(const gguf::Value* types,
                         FindArray(file, kTypesKey, /*required=*/false, "integers", IsInteger));
  if (types == nullptr) return Status::Ok();
  if (types->array.size() != n) {
    return Status::Error(std::string(kTypesKey) + ": " + std::to_string(types->array.size()) +
                         " types for " + std::to_string(n) + " tokens");
  }
  const bool is_signed = IsSignedIntegerType(types->elem_type);
  vocab->types.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    const gguf::Value& type = types->array[i];
    const int64_t value = is_signed ? type.i : static_cast<int64_t>(type.u);
    if (value < 0 || value > static_cast<int64_t>(TokenType::kByte)) {
      return Status::Error(std::string(kTypesKey) + ": token " + std::to_string(i) +
                           " has unknown type " + std::to_string(value));
    }
    vocab->types.push_back(static_cast<TokenType>(value));
  }
  return Status::Ok();
}

// BPE: the merges and what tokenizer.ggml.pre asks for.
Status ReadBpe(const gguf::GgufFile& file, std::string_view model, Vocab* vocab) {
  KVLLM_ASSIGN_OR_RETURN(const gguf::Value* merges,
                         FindArray(file, kMergesKey, /*required=*/true, "strings", IsString));
  vocab->merges.reserve(merges->array.size());
  for (const gguf::Value& merge : merges->array) vocab->merges.push_back(merge.str);

  vocab->add_bos = false;
  if (model == "gemma4") {
    vocab->pre = PreTokenizer::kNewlines;
    vocab->add_bos = true;
    return Status::Ok();
  }
  if (file.Find(kPreKey) == nullptr) {
    vocab->pre = PreTokenizer::kDefault;
    return Status::Ok();
  }
  KVLLM_ASSIGN_OR_RETURN(const std::string pre, file.GetString(kPreKey));
  vocab->pre = PreTokenizer::kGpt2;
  for (const PreTokenizerName& known : kPreTokenizerNames) {
    if (known.name == pre) {
      vocab->pre = known.pre;
      vocab->ignore_merges = known.ignore_merges;
      vocab->add_bos = known.add_bos;
      break;
    }
  }
  return Status::Ok();
}

}  // namespace

StatusOr<Vocab> ReadVocabFromGguf(const gguf::GgufFile& file) {
  KVLLM_ASSIGN_OR_RETURN(const std::string model, file.GetString(kModelKey));
  Vocab vocab;
  if (model == "llama") {
    vocab.kind = TokenizerKind::kSpm;
  } else if (model == "gpt2" || model == "gemma4") {
    vocab.kind = TokenizerKind::kBpe;
    vocab.add_space_prefix = false;
  } else {
    return Status::Error(std::string(kModelKey) + " is \"" + model +
                         "\": supported are \"llama\" (SentencePiece), \"gpt2\" and \"gemma4\" "
                         "(BPE)");
  }

  KVLLM_ASSIGN_OR_RETURN(const gguf::Value* tokens,
                         FindArray(file, kTokensKey, /*required=*/true, "strings", IsString));
  const size_t n = tokens->array.size();
  vocab.pieces.reserve(n);
  for (const gguf::Value& token : tokens->array) vocab.pieces.push_back(token.str);
  KVLLM_RETURN_IF_ERROR(ReadScores(file, n, &vocab));
  KVLLM_RETURN_IF_ERROR(ReadTypes(file, n, &vocab));
  if (vocab.kind == TokenizerKind::kBpe) KVLLM_RETURN_IF_ERROR(ReadBpe(file, model, &vocab));

  // SentencePiece vocabularies put <unk>, <s>, </s> first; BPE ones have no fixed places.
  const bool spm = vocab.kind == TokenizerKind::kSpm;
  KVLLM_ASSIGN_OR_RETURN(vocab.bos, GetTokenId(file, "tokenizer.ggml.bos_token_id",
                                               spm ? 1 : kNoToken, n));
  KVLLM_ASSIGN_OR_RETURN(vocab.eos, GetTokenId(file, "tokenizer.ggml.eos_token_id",
                                               spm ? 2 : kNoToken, n));
  KVLLM_ASSIGN_OR_RETURN(vocab.unk, GetTokenId(file, "tokenizer.ggml.unknown_token_id",
                                               spm ? 0 : kNoToken, n));
  for (std::string_view key : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"}) {
    KVLLM_ASSIGN_OR_RETURN(const TokenId id, GetTokenId(file, key, kNoToken, n));
    if (id != kNoToken) vocab.eog.push_back(id);
  }
  for (size_t i = 0; i < n; ++i) {
    const std::string_view piece = vocab.pieces[i];
    if (std::find(std::begin(kEndOfTurnTexts), std::end(kEndOfTurnTexts), piece) !=
        std::end(kEndOfTurnTexts)) {
      vocab.eog.push_back(static_cast<TokenId>(i));
    }
  }

  KVLLM_ASSIGN_OR_RETURN(vocab.add_bos,
                         file.GetBool("tokenizer.ggml.add_bos_token", vocab.add_bos));
  KVLLM_ASSIGN_OR_RETURN(vocab.add_eos,
                         file.GetBool("tokenizer.ggml.add_eos_token", vocab.add_eos));
  // BPE pre-tokenizers keep spaces themselves; only SentencePiece adds one.
  if (spm) {
    KVLLM_ASSIGN_OR_RETURN(vocab.add_space_prefix,
                           file.GetBool("tokenizer.ggml.add_space_prefix", true));
  }
  return vocab;
}

}  // namespace kvllm
