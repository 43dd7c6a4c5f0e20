// Pieces shared by the kvllm sub-commands: loading a model with its tokenizer, the KV flags,
// and human-readable numbers.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include "base/status.h"
#include "engine/engine.h"
#include "gguf/gguf_file.h"
#include "model/model.h"
#include "tokenizer/chat_template.h"
#include "tokenizer/tokenizer.h"

namespace kvllm::cli {

struct LoadedModel {
  std::unique_ptr<Model> model;
  std::unique_ptr<Tokenizer> tokenizer;
};
StatusOr<LoadedModel> LoadModel(const std::string& path, const ModelLoadOptions& options);

// The chat template named by --chat-template, or the one the model's GGUF declares.
StatusOr<ChatTemplate> ResolveChatTemplate(const Model& model, const std::string& name);

// Flags of the KV cache and the engine, llama.cpp's names where it has them: -c, -t, -ctk,
// -ctv, --block-size, --no-kv-cache, --kv-window, --kv-sinks, --no-mmap, --no-repack.
struct EngineFlags {
  bool no_mmap = false;  // read the weights into huge pages instead of mapping the file
  bool no_repack = false;  // keep the file's rows (no interleaved Q8_0/Q4_0 matrices)
  int32_t ctx_size = 0;
  int32_t threads = 0;
  std::string cache_type_k = "f16";
  std::string cache_type_v = "f16";
  int32_t block_size = 16;
  bool no_kv_cache = false;
  int32_t kv_window = 0;
  int32_t kv_sinks = 4;
  std::string kv_mem;  // memory the KV pool may take ("2G"); default: what is available
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 2048;
  bool no_prefix_caching = false;
  std::string kv_store_dir;
  std::string kv_store_dir_size;  // "20G"; empty: unlimited
  std::string kv_store_redis;

  void Register(CLI::App* app);
  ModelLoadOptions load_options() const {
    return {.mode = no_mmap ? gguf::LoadMode::kRead : gguf::LoadMode::kMmap,
            .repack = !no_repack};
  }
  // Resolves formats and the context size. The default context is the model's, capped so the
  // pool fits --kv-mem or half of the memory available now; an explicit -c whose pool cannot
  // fit --kv-mem (or the available memory) is refused with what would fit. Nothing is
  // allocated and no weight is read before this check.
  StatusOr<EngineOptions> ToOptions(const Model& model) const;
};

// Sampling flags with llama.cpp's names and defaults: --temp, --top-k, --top-p, --min-p,
// --repeat-penalty, --repeat-last-n, -s/--seed.
struct SamplingFlags {
  float temp = 0.8f;
  int32_t top_k = 40;
  float top_p = 0.95f;
  float min_p = 0.05f;
  float repeat_penalty = 1.0f;
  int32_t repeat_last_n = 64;
  int64_t seed = -1;

  void Register(CLI::App* app);
  SamplingParams ToParams() const;
};

// Rewrites llama.cpp's multi-letter short flags (-ctk, -ctv) into their long names, which
// CLI11 can parse.
void RewriteLlamaShortFlags(int argc, char** argv, std::vector<std::string>* args);

// The whole content of a file (prompts, texts to score), or an error naming it.
StatusOr<std::string> ReadTextFile(const std::string& path);

// Median, minimum and maximum of repeated measurements (benchmarks print all three).
struct Spread {
  double median = 0, min = 0, max = 0;
};
Spread Summarize(std::vector<double> values);  // values not empty

std::string FormatBytes(double bytes);   // "1.50 MiB"
StatusOr<uint64_t> ParseBytes(const std::string& text);  // "512M", "2G", "1.5GiB", "1000"
std::string WithCommas(uint64_t value);  // "524,288"
// Bytes of memory the system can give us now (MemAvailable), 0 when unknown.
uint64_t AvailableMemoryBytes();

}  // namespace kvllm::cli
