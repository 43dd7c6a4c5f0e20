// `kvllm perplexity`: llama-perplexity's measurement. The text is cut into chunks of -c tokens;
// each chunk is prefilled once (its first token replaced by BOS) and only the second half of
// its positions is scored, so every scored token sees at least c/2 tokens of context.
// `--kl-divergence-base FILE` saves the scored log-probabilities; `--kl-divergence FILE`
// compares this run against them (mean KL divergence and top-1 agreement), which is how a KV
// format's quality loss is measured against a baseline on the same text and context.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <fstream>

#include "cli/commands.h"
#include "cli/common.h"

namespace kvllm::cli {
namespace {

struct PerplexityFlags {
  std::string model_path;
  std::string text_file;
  int32_t chunks = -1;
  std::string kld_base;  // write
  std::string kld;       // compare
  EngineFlags engine;
};

// Running mean and standard error of a per-token quantity.
struct Stat {
  double sum = 0, sum2 = 0;
  int64_t n = 0;
  void Add(double x) {
    sum += x;
    sum2 += x * x;
    ++n;
  }
  double mean() const { return n ? sum / n : 0; }
  double stderr_of_mean() const {
    if (n < 2) return 0;
    const double var = std::max(0.0, sum2 / n - mean() * mean());
    return std::sqrt(var / (n - 1));
  }
};

// Base file: the scored log-probabilities of one run, in f32 so that a run compared with its
// own base gives exactly 0 and 100% (use --chunks to bound the size).
//   "KVLLMKLD" | u32 version | u32 n_vocab | u32 n_ctx | u32 n_chunks | i32 tokens[n_chunks*n_ctx]
//   | f32 logprobs[n_chunks][n_ctx - 1 - n_ctx/2][n_vocab]
constexpr char kKldMagic[8] = {'K', 'V', 'L', 'L', 'M', 'K', 'L', 'D'};
constexpr uint32_t kKldVersion = 1;

struct KldHeader {
  uint32_t version, n_vocab, n_ctx, n_chunks;
};

void LogSoftmax(const float* logits, int32_t n, std::vector<double>* out) {
  out->resize(n);
  const double m = *std::max_element(logits, logits + n);
  double sum = 0;
  for (int32_t i = 0; i < n; ++i) sum += std::exp(logits[i] - m);
  const double lse = m + std::log(sum);
  for (int32_t i = 0; i < n; ++i) (*out)[i] = logits[i] - lse;
}

int Fail(const std::string& message) {
  std::fprintf(stderr, "kvllm perplexity: %s\n", message.c_str());
  return 1;
}

int Perplexity(PerplexityFlags f) {
  auto text = ReadTextFile(f.text_file);
  if (!text.ok()) return Fail(text.status().message());
  auto loaded = LoadModel(f.model_path, f.engine.load_options());
  if (!loaded.ok()) return Fail(loaded.status().message());
  const Tokenizer& tok = *loaded->tokenizer;
  const int32_t n_vocab = loaded->model->config().n_vocab;
  const int32_t n_ctx = f.engine.ctx_size > 0 ? f.engine.ctx_size : 512;
  if (n_ctx < 4) return Fail("-c must be at least 4");
  f.engine.ctx_size = n_ctx + 1;
  auto opts = f.engine.ToOptions(*loaded->model);
  if (!opts.ok()) return Fail(opts.status().message());
  auto engine = Engine::Create(loaded->model.get(), *opts);
  if (!engine.ok()) return Fail(engine.status().message());

  const std::vector<int32_t> tokens = tok.Encode(*text, /*add_special=*/true);
  int32_t n_chunks = static_cast<int32_t>(tokens.size() / n_ctx);
  if (f.chunks >= 0) n_chunks = std::min(n_chunks, f.chunks);
  if (n_chunks < 1) {
    return Fail("the text has " + std::to_string(tokens.size()) + " tokens; at least -c " +
                std::to_string(n_ctx) + " are needed");
  }
  const int32_t first = n_ctx / 2;
  const int32_t scored_per_chunk = n_ctx - 1 - first;

  std::ofstream base_out;
  std::ifstream base_in;
  if (!f.kld_base.empty()) {
    base_out.open(f.kld_base, std::ios::binary | std::ios::trunc);
    if (!base_out) return Fail("cannot write '" + f.kld_base + "'");
    const KldHeader h{kKldVersion, static_cast<uint32_t>(n_vocab), static_cast<uint32_t>(n_ctx),
                      static_cast<uint32_t>(n_chunks)};
    base_out.write(kKldMagic, sizeof(kKldMagic));
    base_out.write(reinterpret_cast<const char*>(&h), sizeof(h));
    base_out.write(reinterpret_cast<const char*>(tokens.data()),
                   sizeof(int32_t) * static_cast<size_t>(n_chunks) * n_ctx);
  }
  if (!f.kld.empty()) {
    base_in.open(f.kld, std::ios::binary);
    if (!base_in) return Fail("cannot read '" + f.kld + "'");
    char magic[8];
    KldHeader h{};
    base_in.read(magic, sizeof(magic));
    base_in.read(reinterpret_cast<char*>(&h), sizeof(h));
    if (!base_in || std::memcmp(magic, kKldMagic, sizeof(magic)) != 0 || h.version != kKldVersion) {
      return Fail("'" + f.kld + "' is not a kvllm KL-divergence base file");
    }
    if (h.n_vocab != static_cast<uint32_t>(n_vocab) || h.n_ctx != static_cast<uint32_t>(n_ctx) ||
        h.n_chunks < static_cast<uint32_t>(n_chunks)) {
      return Fail("'" + f.kld + "' was made with vocab " + std::to_string(h.n_vocab) + ", -c " +
                  std::to_string(h.n_ctx) + ", " + std::to_string(h.n_chunks) +
                  " chunks; this run has vocab " + std::to_string(n_vocab) + ", -c " +
                  std::to_string(n_ctx) + ", " + std::to_string(n_chunks) + " chunks");
    }
    std::vector<int32_t> base_tokens(static_cast<size_t>(h.n_chunks) * h.n_ctx);
    base_in.read(reinterpret_cast<char*>(base_tokens.data()), sizeof(int32_t) * base_tokens.size());
    if (!base_in || !std::equal(base_tokens.begin(), base_tokens.begin() + int64_t{n_chunks} * n_ctx,
                                tokens.begin())) {
      return Fail("'" + f.kld + "' was computed on a different text or tokenizer");
    }
  }

  std::fprintf(stderr, "perplexity: %zu tokens, %d chunks of %d, scoring the last %d positions "
               "of each; KV %s/%s\n",
               tokens.size(), n_chunks, n_ctx, scored_per_chunk, f.engine.cache_type_k.c_str(),
               f.engine.cache_type_v.c_str());
  Stat nll, kld;
  int64_t top1_same = 0;
  std::vector<int32_t> chunk(n_ctx);
  std::vector<float> logits;
  std::vector<double> logp, base_logp(n_vocab);
  std::vector<float> row(n_vocab);
  for (int32_t c = 0; c < n_chunks; ++c) {
    std::copy(tokens.begin() + int64_t{c} * n_ctx, tokens.begin() + int64_t{c + 1} * n_ctx,
              chunk.begin());
    if (tok.add_bos()) chunk[0] = tok.bos();
    Status st = (*engine)->Evaluate(chunk, first, &logits);
    if (!st.ok()) return Fail(st.message());
    for (int32_t j = 0; j < scored_per_chunk; ++j) {
      LogSoftmax(&logits[static_cast<size_t>(j) * n_vocab], n_vocab, &logp);
      nll.Add(-logp[chunk[first + j + 1]]);
      if (base_out.is_open()) {
        for (int32_t v = 0; v < n_vocab; ++v) row[v] = static_cast<float>(logp[v]);
        base_out.write(reinterpret_cast<const char*>(row.data()), sizeof(float) * row.size());
      }
      if (base_in.is_open()) {
        base_in.read(reinterpret_cast<char*>(row.data()), sizeof(float) * row.size());
        if (!base_in) return Fail("'" + f.kld + "' is truncated");
        double d = 0;
        int32_t top_cur = 0;  // argmax of the f32-rounded values, as the base stores them
        for (int32_t v = 0; v < n_vocab; ++v) {
          if (static_cast<float>(logp[v]) > static_cast<float>(logp[top_cur])) top_cur = v;
          base_logp[v] = row[v];
          d += std::exp(base_logp[v]) * (base_logp[v] - logp[v]);
        }
        kld.Add(d);
        top1_same += std::max_element(base_logp.begin(), base_logp.end()) - base_logp.begin() ==
                     top_cur;
      }
    }
    std::printf("[%d]%.4f%s", c + 1, std::exp(nll.mean()), c + 1 < n_chunks ? "," : "\n");
    std::fflush(stdout);
  }
  const double ppl = std::exp(nll.mean());
  std::printf("Final estimate: PPL = %.4f +/- %.5f (%lld tokens scored)\n", ppl,
              ppl * nll.stderr_of_mean(), static_cast<long long>(nll.n));
  if (base_in.is_open()) {
    // KL divergence is never negative; a tiny negative mean is f32 rounding of the base.
    std::printf("Mean KLD: %.6f +/- %.6f; same top-1 token: %.3f%% (vs %s)\n",
                std::max(0.0, kld.mean()),
                kld.stderr_of_mean(), 100.0 * top1_same / std::max<int64_t>(kld.n, 1),
                f.kld.c_str());
  }
  if (base_out.is_open()) {
    base_out.close();
    if (!base_out) return Fail("writing '" + f.kld_base + "' failed");
    std::fprintf(stderr, "perplexity: saved log-probabilities to %s\n", f.kld_base.c_str());
  }
  return 0;
}

}  // namespace

Command RegisterPerplexity(CLI::App* app) {
  auto f = std::make_shared<PerplexityFlags>();
  CLI::App* sub = app->add_subcommand("perplexity", "perplexity of a text, llama-perplexity style");
  sub->add_option("-m,--model", f->model_path, "GGUF model file")->required();
  sub->add_option("-f,--file", f->text_file, "text file to score")->required();
  sub->add_option("--chunks", f->chunks, "score at most this many chunks (-1: all)")
      ->capture_default_str();
  sub->add_option("--kl-divergence-base", f->kld_base, "save this run's log-probabilities");
  sub->add_option("--kl-divergence", f->kld, "compare with a saved base (mean KLD, top-1)");
  f->engine.Register(sub);
  return [f] { return Perplexity(*f); };
}

}  // namespace kvllm::cli
