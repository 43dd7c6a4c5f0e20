#include "cli/common.h"

#include <algorithm>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvllm::cli {

StatusOr<LoadedModel> LoadModel(const std::string& path) {
  LoadedModel m;
  KVLLM_ASSIGN_OR_RETURN(m.model, Model::Load(path));
  KVLLM_ASSIGN_OR_RETURN(Tokenizer tok, Tokenizer::FromGguf(m.model->file()));
  if (tok.vocab_size() != m.model->config().n_vocab) {
    return Status::Error("model: the tokenizer has " + std::to_string(tok.vocab_size()) +
                         " tokens but the model's vocabulary is " +
                         std::to_string(m.model->config().n_vocab));
  }
  m.tokenizer = std::make_unique<Tokenizer>(std::move(tok));
  return m;
}

void EngineFlags::Register(CLI::App* app) {
  app->add_option("-c,--ctx-size", ctx_size,
                  "KV cache size in tokens (default: the model's context length, capped by "
                  "available memory)");
  app->add_option("-t,--threads", threads, "threads (default: one per CPU)");
  app->add_option("--cache-type-k", cache_type_k, "K cache format (-ctk): f32, f16, bf16, q8_0, q4_0")
      ->capture_default_str();
  app->add_option("--cache-type-v", cache_type_v, "V cache format (-ctv): f32, f16, bf16, q8_0, q4_0")
      ->capture_default_str();
  app->add_option("--block-size", block_size, "tokens per KV block")->capture_default_str();
  app->add_flag("--no-kv-cache", no_kv_cache,
                "baseline: recompute the whole sequence at every step");
  app->add_option("--kv-window", kv_window,
                  "sliding window: attend to the last W tokens (plus the sinks) and release "
                  "older blocks, so memory stays flat (0: off)")
      ->capture_default_str();
  app->add_option("--kv-sinks", kv_sinks, "attention sinks kept with --kv-window")
      ->capture_default_str();
}

StatusOr<EngineOptions> EngineFlags::ToOptions(const Model& model) const {
  EngineOptions o;
  for (auto [name, out] : {std::pair{&cache_type_k, &o.k_type}, std::pair{&cache_type_v, &o.v_type}}) {
    std::optional<DType> t = DTypeFromName(*name);
    if (!t) {
      return Status::Error("unsupported KV cache type '" + *name +
                           "' (supported: f32, f16, bf16, q8_0, q4_0)");
    }
    *out = *t;
  }
  if (block_size <= 0 || block_size > 4096) {
    return Status::Error("--block-size must be between 1 and 4096");
  }
  if (ctx_size < 0) return Status::Error("-c/--ctx-size must not be negative");
  o.block_size = block_size;
  o.n_threads = threads;
  o.kv_cache = !no_kv_cache;
  o.ctx_size = ctx_size;
  o.kv_window = kv_window;
  o.kv_sinks = kv_window > 0 ? kv_sinks : 0;
  if (o.ctx_size == 0) {
    o.ctx_size = model.config().n_ctx_train;
    KVLLM_ASSIGN_OR_RETURN(KVLayout layout, KVLayout::Make(model.kv_shape(), o.block_size,
                                                           o.k_type, o.v_type));
    const uint64_t avail = AvailableMemoryBytes();
    if (avail > 0) {
      const uint64_t fit = avail / 2 / layout.bytes_per_token();
      o.ctx_size = static_cast<int32_t>(std::min<uint64_t>(o.ctx_size, std::max<uint64_t>(fit, 1)));
    }
  }
  return o;
}

void RewriteLlamaShortFlags(int argc, char** argv, std::vector<std::string>* args) {
  args->clear();
  for (int i = 0; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "-ctk") a = "--cache-type-k";
    if (a == "-ctv") a = "--cache-type-v";
    args->push_back(a);
  }
}

std::string FormatBytes(double bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (bytes >= 1024 && u < 4) {
    bytes /= 1024;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof(buf), u == 0 ? "%.0f %s" : "%.2f %s", bytes, units[u]);
  return buf;
}

std::string WithCommas(uint64_t value) {
  const std::string digits = std::to_string(value);
  std::string s;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i > 0 && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

uint64_t AvailableMemoryBytes() {
  std::ifstream in("/proc/meminfo");
  std::string key;
  uint64_t kib = 0;
  std::string unit;
  while (in >> key >> kib >> unit) {
    if (key == "MemAvailable:") return kib * 1024;
  }
  return 0;
}

}  // namespace kvllm::cli
