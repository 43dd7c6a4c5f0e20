// Fuzzes the GGUF reader (GgufFile::Parse) and what reads a parsed file: every metadata getter,
// the tensor index, the vocabulary reader (Tokenizer::FromGguf) and ModelConfig::FromGguf.
// A parse that succeeds must describe tensor data that lies inside the buffer.
#include <cstddef>
#include <cstdint>
#include <string>

#include "fuzz/fuzz_support.h"
#include "gguf/gguf_file.h"
#include "model/model_config.h"
#include "tokenizer/tokenizer.h"

namespace kvllm::fuzz {
namespace {

void CheckParsed(const gguf::GgufFile& file, size_t size) {
  FUZZ_CHECK(file.version() == 2 || file.version() == 3, std::to_string(file.version()));
  FUZZ_CHECK(file.header().size() <= size, "header longer than the file");
  for (const auto& [key, value] : file.metadata()) {
    (void)value.ToString();
    FUZZ_CHECK(file.Find(key) != nullptr, "metadata key not found: " + key);
    (void)file.GetUint(key, 0);
    (void)file.GetFloat(key, 0.0);
    (void)file.GetString(key);
    (void)file.GetBool(key, false);
  }
  for (const gguf::TensorInfo& t : file.tensors()) {
    FUZZ_CHECK(file.FindTensor(t.name) == &t, "tensor not found: " + t.name);
    FUZZ_CHECK(t.n_dims <= 4, t.name);
    if (t.n_bytes == 0) continue;
    FUZZ_CHECK(file.data_offset() <= size && t.offset <= size - file.data_offset() &&
                   t.n_bytes <= size - file.data_offset() - t.offset,
               "tensor " + t.name + " lies outside the file");
    // ASan reports a read outside the buffer here.
    const auto* bytes = static_cast<const volatile uint8_t*>(t.data);
    (void)bytes[0];
    (void)bytes[t.n_bytes - 1];
  }
  if (StatusOr<Tokenizer> tok = Tokenizer::FromGguf(file); tok.ok()) {
    const std::vector<TokenId> ids = tok->Encode("Hello, world! \xF0\x9F\x98\x80 \xFF", true);
    for (TokenId id : ids) FUZZ_CHECK(id >= 0 && id < tok->vocab_size(), std::to_string(id));
    (void)tok->Decode(ids);
  }
  (void)ModelConfig::FromGguf(file);
}

}  // namespace
}  // namespace kvllm::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvllm::StatusOr<kvllm::gguf::GgufFile> file = kvllm::gguf::GgufFile::Parse(data, size);
  if (file.ok()) {
    kvllm::fuzz::CheckParsed(*file, size);
  } else {
    FUZZ_CHECK(!file.status().message().empty(), "an error without a message");
  }
  return 0;
}
