#include "cli/common.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <fstream>
#include <sstream>

namespace kvllm::cli {

StatusOr<LoadedModel> LoadModel(const std::string& path, const ModelLoadOptions& options) {
  LoadedModel m;
  KVLLM_ASSIGN_OR_RETURN(m.model, Model::Load(path, options));
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
  app->add_flag("--no-mmap", no_mmap,
                "read the weights into memory (2 MiB huge pages where the kernel allows) "
                "instead of mapping the file: a slower start, faster decode");
  app->add_flag("--no-repack", no_repack,
                "keep Q8_0/Q4_0/F16/BF16 matrices in the file's rows instead of interleaving "
                "them 16 rows at a time at load (AVX-512); for comparisons");
  app->add_option("-c,--ctx-size", ctx_size,
                  "KV cache size in tokens (default: the model's context length, capped by "
                  "available memory)");
  app->add_option("-t,--threads", threads, "threads (default: one per CPU)");
  app->add_option("--cache-type-k", cache_type_k,
                  std::string("K cache format (-ctk): ") + KVFormatNames())
      ->capture_default_str();
  app->add_option("--cache-type-v", cache_type_v,
                  std::string("V cache format (-ctv): ") + KVFormatNames())
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
  app->add_option("--kv-mem", kv_mem,
                  "memory the KV cache may take, e.g. 512M or 2G (default: what is available)");
  app->add_option("--max-num-seqs", max_num_seqs, "sequences batched in one step at most")
      ->capture_default_str();
  app->add_option("--max-num-batched-tokens", max_num_batched_tokens,
                  "tokens computed in one step at most (decode tokens, then prefill chunks)")
      ->capture_default_str();
  app->add_flag("--no-prefix-caching", no_prefix_caching,
                "do not reuse the KV of a prompt prefix computed before (for comparison)");
  app->add_option("--kv-store-dir", kv_store_dir,
                  "keep computed KV blocks in this directory too, so prefixes survive a restart");
  app->add_option("--kv-store-dir-size", kv_store_dir_size,
                  "size limit of --kv-store-dir, e.g. 20G (least recently used blocks go first; "
                  "default: unlimited)");
  app->add_option("--kv-store-redis", kv_store_redis,
                  "share computed KV blocks through Redis, e.g. redis://127.0.0.1:6379/0");
}

StatusOr<ChatTemplate> ResolveChatTemplate(const Model& model, const std::string& name) {
  if (name.empty()) {
    auto jinja = model.file().GetString("tokenizer.chat_template");
    return ChatTemplate::Detect(jinja.ok() ? *jinja : "");
  }
  std::optional<ChatTemplate> tmpl = ChatTemplate::FromName(name);
  if (!tmpl) {
    std::string names;
    for (const std::string& n : ChatTemplate::Names()) names += (names.empty() ? "" : ", ") + n;
    return Status::Error("unknown chat template '" + name + "' (known: " + names + ")");
  }
  return *tmpl;
}

StatusOr<EngineOptions> EngineFlags::ToOptions(const Model& model) const {
  EngineOptions o;
  for (auto [name, out] : {std::pair{&cache_type_k, &o.k_type}, std::pair{&cache_type_v, &o.v_type}}) {
    std::optional<KVFormat> f = KVFormat::FromName(*name);
    if (!f) {
      return Status::Error("unsupported KV cache type '" + *name + "' (supported: " +
                           KVFormatNames() + ")");
    }
    *out = *f;
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
  o.prefix_caching = !no_prefix_caching;
  o.kv_store_dir = kv_store_dir;
  o.kv_store_redis = kv_store_redis;
  if (!kv_store_dir_size.empty()) {
    KVLLM_ASSIGN_OR_RETURN(o.kv_store_dir_bytes, ParseBytes(kv_store_dir_size));
  }
  o.scheduler.max_num_seqs = max_num_seqs;
  o.scheduler.max_num_batched_tokens = max_num_batched_tokens;
  KVLLM_ASSIGN_OR_RETURN(KVLayout layout, KVLayout::Make(model.kv_shape(), o.block_size,
                                                         o.k_type, o.v_type));
  uint64_t budget = 0;
  if (!kv_mem.empty()) {
    KVLLM_ASSIGN_OR_RETURN(budget, ParseBytes(kv_mem));
  }
  const uint64_t avail = AvailableMemoryBytes();
  // Whole blocks of the pool: what the engine will allocate for `tokens`.
  auto pool_bytes = [&](uint64_t tokens) {
    return (tokens + o.block_size - 1) / o.block_size * layout.bytes_per_block();
  };
  if (o.ctx_size == 0) {
    // The model's context, capped by --kv-mem or half of the memory available now.
    o.ctx_size = model.config().n_ctx_train;
    const uint64_t cap = budget > 0 ? budget : avail / 2;
    if (cap > 0) {
      const uint64_t fit = cap / layout.bytes_per_block() * o.block_size;
      o.ctx_size = static_cast<int32_t>(std::min<uint64_t>(o.ctx_size, std::max<uint64_t>(fit, 1)));
    }
  }
  const uint64_t limit = budget > 0 ? budget : avail;
  if (limit > 0 && pool_bytes(o.ctx_size) > limit) {
    const uint64_t fit = limit / layout.bytes_per_block() * o.block_size;
    std::string msg = "a KV cache of " + WithCommas(o.ctx_size) + " tokens in " +
                      o.k_type.name() + "/" + o.v_type.name() + " needs " +
                      FormatBytes(static_cast<double>(pool_bytes(o.ctx_size))) + " but " +
                      (budget > 0 ? "--kv-mem allows " : "only ") +
                      FormatBytes(static_cast<double>(limit)) +
                      (budget > 0 ? "" : " of memory is available") + "; at most " +
                      WithCommas(fit) + " tokens fit (-c)";
    for (DType t : {DType::kQ8_0, DType::kQ4_0}) {
      auto smaller = KVLayout::Make(model.kv_shape(), o.block_size, t, t);
      if (!smaller.ok()) continue;
      const uint64_t need = (static_cast<uint64_t>(o.ctx_size) + o.block_size - 1) /
                            o.block_size * smaller->bytes_per_block();
      if (need <= limit) {
        msg += std::string(", or keep -c and use -ctk ") + DTypeName(t) + " -ctv " + DTypeName(t) +
               " (" + FormatBytes(static_cast<double>(need)) + ")";
        break;
      }
    }
    return Status::Error(msg);
  }
  return o;
}

void SamplingFlags::Register(CLI::App* app) {
  app->add_option("--temp", temp, "temperature (0: greedy)")->capture_default_str();
  app->add_option("--top-k", top_k, "top-k sampling (0: off)")->capture_default_str();
  app->add_option("--top-p", top_p, "top-p sampling (1: off)")->capture_default_str();
  app->add_option("--min-p", min_p, "min-p sampling (0: off)")->capture_default_str();
  app->add_option("--repeat-penalty", repeat_penalty, "repetition penalty (1: off)")
      ->capture_default_str();
  app->add_option("--repeat-last-n", repeat_last_n, "tokens the repetition penalty sees")
      ->capture_default_str();
  app->add_option("-s,--seed", seed, "RNG seed (-1: random)")->capture_default_str();
}

SamplingParams SamplingFlags::ToParams() const {
  SamplingParams p;
  p.temperature = temp;
  p.top_k = top_k;
  p.top_p = top_p;
  p.min_p = min_p;
  p.repeat_penalty = repeat_penalty;
  p.repeat_last_n = repeat_last_n;
  p.seed = seed < 0 ? SamplingParams::kRandomSeed : static_cast<uint64_t>(seed);
  return p;
}

StatusOr<std::string> ReadTextFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot read '" + path + "'");
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
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

Spread Summarize(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const size_t n = v.size();
  const double median = n % 2 ? v[n / 2] : (v[n / 2 - 1] + v[n / 2]) / 2;
  return {median, v.front(), v.back()};
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

StatusOr<uint64_t> ParseBytes(const std::string& text) {
  size_t used = 0;
  double value = 0;
  try {
    value = std::stod(text, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  std::string unit = text.substr(used);
  for (char& c : unit) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit[1] == 'I') unit.pop_back();  // KiB, MiB, GiB: binary anyway
  double scale = 0;
  if (unit.empty()) scale = 1;
  if (unit == "K") scale = 1024.0;
  if (unit == "M") scale = 1024.0 * 1024;
  if (unit == "G") scale = 1024.0 * 1024 * 1024;
  if (unit == "T") scale = 1024.0 * 1024 * 1024 * 1024;
  if (used == 0 || scale == 0 || !(value > 0)) {
    return Status::Error("cannot read '" + text + "' as a size (e.g. 512M, 2G, 1.5GiB)");
  }
  return static_cast<uint64_t>(value * scale);
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
