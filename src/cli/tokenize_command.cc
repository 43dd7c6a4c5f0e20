// `kvllm tokenize`: text to token ids with a model's vocabulary (llama-tokenize's job), for
// checking tokenizers and for tools that must tokenize exactly as kvllm does.
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf_file.h"
#include "tokenizer/tokenizer.h"

namespace kvllm::cli {
namespace {

struct TokenizeFlags {
  std::string model_path;
  std::string prompt;
  std::string file;
  bool ids_only = false;
  bool no_bos = false;
};

int Tokenize(const TokenizeFlags& f) {
  std::string text = f.prompt;
  if (!f.file.empty()) {
    auto content = ReadTextFile(f.file);
    if (!content.ok()) {
      std::fprintf(stderr, "kvllm tokenize: %s\n", content.status().message().c_str());
      return 1;
    }
    text = std::move(content).value();
  }
  // Only the vocabulary is needed: a vocab-only GGUF file works too.
  auto file = gguf::GgufFile::Open(f.model_path);
  if (!file.ok()) {
    std::fprintf(stderr, "kvllm tokenize: %s\n", file.status().message().c_str());
    return 1;
  }
  auto tok = Tokenizer::FromGguf(*file);
  if (!tok.ok()) {
    std::fprintf(stderr, "kvllm tokenize: %s\n", tok.status().message().c_str());
    return 1;
  }
  const std::vector<TokenId> ids = tok->Encode(text, /*add_special=*/!f.no_bos);
  if (f.ids_only) {
    std::cout << nlohmann::json(ids).dump() << std::endl;
    return 0;
  }
  for (TokenId id : ids) {
    // A byte token alone may be part of a UTF-8 character: shown as U+FFFD.
    std::cout << id << " -> "
              << nlohmann::json(tok->TokenToPiece(id))
                     .dump(-1, ' ', false, nlohmann::json::error_handler_t::replace)
              << "\n";
  }
  return 0;
}

}  // namespace

Command RegisterTokenize(CLI::App* app) {
  auto f = std::make_shared<TokenizeFlags>();
  CLI::App* sub = app->add_subcommand("tokenize", "print the token ids of a text");
  sub->add_option("-m,--model", f->model_path, "GGUF model or vocabulary file")->required();
  auto* p = sub->add_option("-p,--prompt", f->prompt, "text");
  sub->add_option("-f,--file", f->file, "read the text from a file")->excludes(p);
  sub->add_flag("--ids", f->ids_only, "print only a JSON list of ids");
  sub->add_flag("--no-bos", f->no_bos, "do not add BOS/EOS as the vocabulary asks");
  return [f] { return Tokenize(*f); };
}

}  // namespace kvllm::cli
