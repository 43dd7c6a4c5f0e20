// `kvllm inspect FILE`: what a GGUF file holds (metadata, tensors) and what its KV cache costs.
#include <cstdio>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf_file.h"
#include "kv/kv_layout.h"
#include "model/model_config.h"

namespace kvllm::cli {
namespace {

int Inspect(const std::string& path) {
  auto file = gguf::GgufFile::Open(path);
  if (!file.ok()) {
    std::fprintf(stderr, "kvllm inspect: %s\n", file.status().message().c_str());
    return 1;
  }
  std::printf("file: %s (GGUF v%u, %s, alignment %llu)\n", path.c_str(), file->version(),
              FormatBytes(static_cast<double>(file->file_size())).c_str(),
              static_cast<unsigned long long>(file->alignment()));
  std::printf("\nmetadata (%zu keys):\n", file->metadata().size());
  for (const auto& [key, value] : file->metadata()) {
    std::printf("  %-45s %s\n", key.c_str(), value.ToString().c_str());
  }
  std::printf("\ntensors (%zu):\n", file->tensors().size());
  for (const gguf::TensorInfo& t : file->tensors()) {
    std::string shape;
    for (uint32_t i = 0; i < t.n_dims; ++i) shape += (i ? " x " : "") + std::to_string(t.ne[i]);
    const char* type = gguf::GetGgmlTypeTraits(static_cast<uint32_t>(t.type)).name;
    std::printf("  %-32s %-6s %-18s %s\n", t.name.c_str(), type ? type : "?", shape.c_str(),
                FormatBytes(static_cast<double>(t.n_bytes)).c_str());
  }
  auto config = ModelConfig::FromGguf(*file);
  if (!config.ok()) {
    std::printf("\nnot a model kvllm can run: %s\n", config.status().message().c_str());
    return 0;
  }
  const ModelConfig& c = *config;
  std::printf("\nmodel: %s, %d layers, embedding %d, ffn %d, %d heads (%d KV heads, head_dim %d), "
              "vocab %d, trained context %d\n",
              c.arch.c_str(), c.n_layer, c.n_embd, c.n_ff, c.n_head, c.n_kv_head, c.head_dim,
              c.n_vocab, c.n_ctx_train);
  std::printf("KV cache per token (all layers, K + V):\n");
  for (DType t : {DType::kF32, DType::kF16}) {
    auto layout = KVLayout::Make(KVShape{c.n_layer, c.n_kv_head, c.head_dim}, 16, t, t);
    if (!layout.ok()) continue;
    const size_t per_token = layout->bytes_per_token();
    std::printf("  %-4s %s bytes per token; %s at the trained context of %d tokens\n",
                DTypeName(t), WithCommas(per_token).c_str(),
                FormatBytes(static_cast<double>(per_token) * c.n_ctx_train).c_str(),
                c.n_ctx_train);
  }
  return 0;
}

}  // namespace

Command RegisterInspect(CLI::App* app) {
  auto path = std::make_shared<std::string>();
  CLI::App* sub = app->add_subcommand("inspect", "print a GGUF file's metadata and tensors");
  sub->add_option("file", *path, "GGUF file")->required();
  return [path] { return Inspect(*path); };
}

}  // namespace kvllm::cli
