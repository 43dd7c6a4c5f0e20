// `kvllm kv-size`: what the KV cache costs, exactly, for a model (from its GGUF file or a
// preset shape) in every format: bytes per token and per block, and for a given context,
// batch and sliding window. The numbers come from KVLayout, the same code that sizes the
// engine's pool, so they agree with what `kvllm run` allocates to the byte. A KIVI K (k4, k2)
// also keeps one block of f16 K per sequence outside the pool while that block fills; it is
// listed as staging and counted in the totals.
#include <cstdio>
#include <iostream>
#include <utility>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "gguf/gguf_file.h"
#include "kv/kv_format.h"
#include "kv/kv_layout.h"
#include "model/model_config.h"

namespace kvllm::cli {
namespace {

struct Preset {
  const char* name;
  KVShape shape;
  int32_t n_ctx_train;
};
constexpr Preset kPresets[] = {
    {"llama-2-7b", {32, 32, 128}, 4096},
    {"llama-3-8b", {32, 8, 128}, 8192},
    {"mistral-7b", {32, 8, 128}, 32768},
    {"tinyllama-1.1b", {22, 4, 64}, 2048},
};

struct KvSizeFlags {
  std::string model_path;
  std::string preset;
  KVShape shape;
  std::vector<int64_t> contexts;
  int32_t batch = 1;
  int32_t block_size = 16;
  int32_t window = 0;
  int32_t sinks = 4;
  bool json = false;
};

// Blocks one sequence of `tokens` holds (with a window: at most what the window keeps).
int64_t BlocksPerSequence(int64_t tokens, int32_t bs, int32_t window, int32_t sinks) {
  int64_t blocks = (tokens + bs - 1) / bs;
  if (window > 0) {
    blocks = std::min<int64_t>(blocks, (sinks + bs - 1) / bs + (window + bs - 1) / bs + 1);
  }
  return blocks;
}

// Bytes per token of a block: exact, an integer unless a KIVI K's per-block scales do not
// divide evenly over the block.
nlohmann::json PerToken(size_t bytes_per_block, int32_t block_size) {
  if (bytes_per_block % block_size == 0) return bytes_per_block / block_size;
  return static_cast<double>(bytes_per_block) / block_size;
}

std::string PerTokenText(size_t bytes_per_block, int32_t block_size) {
  if (bytes_per_block % block_size == 0) return WithCommas(bytes_per_block / block_size);
  const uint64_t hundredths = (uint64_t{bytes_per_block} * 100 + block_size / 2) / block_size;
  char cents[8];
  std::snprintf(cents, sizeof(cents), ".%02u", static_cast<unsigned>(hundredths % 100));
  return WithCommas(hundredths / 100) + cents;
}

int KvSize(KvSizeFlags f) {
  std::string what;
  if (!f.model_path.empty()) {
    auto file = gguf::GgufFile::Open(f.model_path);
    if (!file.ok()) {
      std::fprintf(stderr, "kvllm kv-size: %s\n", file.status().message().c_str());
      return 1;
    }
    auto c = ModelConfig::FromGguf(*file);
    if (!c.ok()) {
      std::fprintf(stderr, "kvllm kv-size: %s\n", c.status().message().c_str());
      return 1;
    }
    f.shape = {c->n_layer, c->n_kv_head, c->head_dim};
    what = f.model_path;
    if (f.contexts.empty()) f.contexts = {c->n_ctx_train};
  } else if (!f.preset.empty()) {
    const Preset* p = nullptr;
    for (const Preset& q : kPresets) {
      if (f.preset == q.name) p = &q;
    }
    if (p == nullptr) {
      std::string names;
      for (const Preset& q : kPresets) names += std::string(names.empty() ? "" : ", ") + q.name;
      std::fprintf(stderr, "kvllm kv-size: unknown preset '%s' (known: %s)\n", f.preset.c_str(),
                   names.c_str());
      return 1;
    }
    f.shape = p->shape;
    what = std::string("preset ") + p->name;
    if (f.contexts.empty()) f.contexts = {4096, 8192};
  } else if (f.shape.n_layer > 0 && f.shape.n_kv_head > 0 && f.shape.head_dim > 0) {
    what = "shape";
    if (f.contexts.empty()) f.contexts = {4096};
  } else {
    std::fprintf(stderr, "kvllm kv-size: give -m FILE, --preset NAME, or --n-layer, "
                         "--n-kv-head and --head-dim\n");
    return 1;
  }
  for (int64_t c : f.contexts) {
    if (c <= 0) {
      std::fprintf(stderr, "kvllm kv-size: contexts must be positive\n");
      return 1;
    }
  }
  if (f.batch < 1) {
    std::fprintf(stderr, "kvllm kv-size: --batch must be at least 1\n");
    return 1;
  }

  // K = V for every format valid in both roles, and the rotated K with its plain V.
  std::vector<std::pair<KVFormat, KVFormat>> pairs;
  for (KVFormat fmt : KVFormat::All()) {
    pairs.emplace_back(fmt, fmt.rotated() ? KVFormat(fmt.row_type()) : fmt);
  }
  nlohmann::json rows = nlohmann::json::array();
  if (!f.json) {
    std::printf("%s: %d layers, %d KV heads, head_dim %d; block %d tokens; batch %d%s\n\n",
                what.c_str(), f.shape.n_layer, f.shape.n_kv_head, f.shape.head_dim,
                f.block_size, f.batch,
                f.window > 0 ? (", window " + std::to_string(f.window) + " + " +
                                std::to_string(f.sinks) + " sinks").c_str()
                             : "");
    std::printf("| K / V         | bytes/token | bytes/block | staging/seq |");
    for (int64_t c : f.contexts) std::printf(" %8lld tokens |", static_cast<long long>(c));
    std::printf("\n|---------------|------------:|------------:|------------:|");
    for (size_t i = 0; i < f.contexts.size(); ++i) std::printf("----------------:|");
    std::printf("\n");
  }
  for (auto [kf, vf] : pairs) {
    auto layout = KVLayout::Make(f.shape, f.block_size, kf, vf);
    if (!layout.ok()) continue;  // e.g. head_dim not a multiple of 32 for q8_0
    const size_t staging = layout->staging_bytes_per_sequence();
    nlohmann::json row{{"k_type", kf.name()},
                       {"v_type", vf.name()},
                       {"bytes_per_token", PerToken(layout->bytes_per_block(), f.block_size)},
                       {"bytes_per_block", layout->bytes_per_block()},
                       {"staging_bytes_per_sequence", staging}};
    if (!f.json) {
      const std::string pair = std::string(kf.name()) + " / " + vf.name();
      std::printf("| %-13s | %11s | %11s | %11s |", pair.c_str(),
                  PerTokenText(layout->bytes_per_block(), f.block_size).c_str(),
                  WithCommas(layout->bytes_per_block()).c_str(),
                  staging > 0 ? FormatBytes(static_cast<double>(staging)).c_str() : "-");
    }
    for (int64_t c : f.contexts) {
      const uint64_t bytes = static_cast<uint64_t>(BlocksPerSequence(c, f.block_size, f.window, f.sinks)) *
                             layout->bytes_per_block() * f.batch;
      const uint64_t staged = static_cast<uint64_t>(staging) * f.batch;
      row["contexts"].push_back(
          {{"tokens", c}, {"bytes", bytes}, {"staging_bytes", staged}, {"total_bytes", bytes + staged}});
      if (!f.json) std::printf(" %15s |", FormatBytes(static_cast<double>(bytes + staged)).c_str());
    }
    rows.push_back(row);
    if (!f.json) std::printf("\n");
  }

  // Each format alone, as K and as V, so that any pair's cost is the sum of its two halves.
  nlohmann::json halves = nlohmann::json::array();
  if (!f.json) {
    std::printf("\n| format | K bytes/token | V bytes/token |\n"
                "|--------|--------------:|--------------:|\n");
  }
  for (KVFormat fmt : KVFormat::All()) {
    nlohmann::json half{{"format", fmt.name()}};
    std::string text[2];
    for (KVRole role : {KVRole::kK, KVRole::kV}) {
      const char* key = role == KVRole::kK ? "k_bytes_per_token" : "v_bytes_per_token";
      std::string& cell = text[role == KVRole::kK ? 0 : 1];
      if (!fmt.Validate(role, f.shape.head_dim).ok()) {
        half[key] = nullptr;
        cell = "-";
        continue;
      }
      const size_t per_block = static_cast<size_t>(f.shape.n_layer) * f.shape.n_kv_head *
                               fmt.HeadBytesPerBlock(role, f.block_size, f.shape.head_dim);
      half[key] = PerToken(per_block, f.block_size);
      cell = PerTokenText(per_block, f.block_size);
    }
    halves.push_back(half);
    if (!f.json) std::printf("| %-6s | %13s | %13s |\n", fmt.name(), text[0].c_str(), text[1].c_str());
  }
  if (f.json) {
    std::cout << nlohmann::json{{"source", what}, {"n_layer", f.shape.n_layer},
                                {"n_kv_head", f.shape.n_kv_head}, {"head_dim", f.shape.head_dim},
                                {"block_size", f.block_size}, {"batch", f.batch},
                                {"window", f.window}, {"sinks", f.window > 0 ? f.sinks : 0},
                                {"formats", rows}, {"per_format", halves}}
                     .dump(2)
              << std::endl;
  } else {
    std::printf("\nTotals hold whole blocks: ceil(context / block) blocks per sequence%s, plus "
                "each sequence's staging (k4, k2 K: one block of f16 K while it fills). "
                "q4_0r is a K format (Hadamard-rotated q4_0).\n",
                f.window > 0 ? ", at most ceil(sinks/block) + ceil(window/block) + 1 with the window"
                             : "");
  }
  return 0;
}

}  // namespace

Command RegisterKvSize(CLI::App* app) {
  auto f = std::make_shared<KvSizeFlags>();
  CLI::App* sub = app->add_subcommand("kv-size", "what the KV cache costs, per token and per context");
  auto* m = sub->add_option("-m,--model", f->model_path, "GGUF model file");
  auto* p = sub->add_option("--preset", f->preset,
                            "llama-2-7b, llama-3-8b, mistral-7b, tinyllama-1.1b")
                ->excludes(m);
  sub->add_option("--n-layer", f->shape.n_layer, "layers (without -m/--preset)")->excludes(m)->excludes(p);
  sub->add_option("--n-kv-head", f->shape.n_kv_head, "KV heads")->excludes(m)->excludes(p);
  sub->add_option("--head-dim", f->shape.head_dim, "head dimension")->excludes(m)->excludes(p);
  sub->add_option("-c,--ctx-size", f->contexts, "context sizes in tokens (comma-separated)")
      ->delimiter(',');
  sub->add_option("--batch", f->batch, "sequences")->capture_default_str();
  sub->add_option("--block-size", f->block_size, "tokens per KV block")->capture_default_str();
  sub->add_option("--kv-window", f->window, "sliding window (0: off)")->capture_default_str();
  sub->add_option("--kv-sinks", f->sinks, "attention sinks with --kv-window")->capture_default_str();
  sub->add_flag("--json", f->json, "print JSON");
  return [f] { return KvSize(*f); };
}

}  // namespace kvllm::cli
