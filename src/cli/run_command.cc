// `kvllm run`: generate text for one prompt, streaming it, then report what prefill, decode
// and the KV cache cost.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/session.h"

namespace kvllm::cli {
namespace {

struct RunFlags {
  std::string model_path;
  std::string prompt;
  std::string prompt_file;
  int32_t n_predict = 128;
  SamplingFlags sampling;
  bool ignore_eos = false;
  bool json = false;
  std::string prompt_cache;  // llama.cpp's --prompt-cache: the prompt's KV saved and reused
  bool prompt_cache_all = false;
  EngineFlags engine;
};

int Run(const RunFlags& f) {
  std::string prompt = f.prompt;
  if (!f.prompt_file.empty()) {
    auto text = ReadTextFile(f.prompt_file);
    if (!text.ok()) {
      std::fprintf(stderr, "kvllm run: %s\n", text.status().message().c_str());
      return 1;
    }
    prompt = std::move(text).value();
  }
  auto loaded = LoadModel(f.model_path, f.engine.load_options());
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvllm run: %s\n", loaded.status().message().c_str());
    return 1;
  }
  Model& model = *loaded->model;
  const Tokenizer& tok = *loaded->tokenizer;
  auto opts = f.engine.ToOptions(model);
  if (!opts.ok()) {
    std::fprintf(stderr, "kvllm run: %s\n", opts.status().message().c_str());
    return 1;
  }
  auto engine = Engine::Create(&model, *opts);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvllm run: %s\n", engine.status().message().c_str());
    return 1;
  }

  if (!f.prompt_cache.empty()) {
    auto restored = RestoreSession(f.prompt_cache, **engine);
    if (!restored.ok()) {
      std::fprintf(stderr, "kvllm run: %s\n", restored.status().message().c_str());
      return 1;
    }
    if (*restored && !f.json) {
      std::fprintf(stderr, "prompt cache %s: %zu tokens saved, %d blocks of KV restored\n",
                   f.prompt_cache.c_str(), (*restored)->tokens.size(), (*restored)->blocks);
    }
  }

  Request req;
  req.prompt = tok.Encode(prompt, /*add_special=*/true);
  req.params.max_tokens = f.n_predict;
  req.params.sampling = f.sampling.ToParams();
  if (!f.ignore_eos) req.params.stop_tokens = tok.EogTokens();
  auto seq = (*engine)->Add(std::move(req));
  if (!seq.ok()) {
    std::fprintf(stderr, "kvllm run: %s\n", seq.status().message().c_str());
    return 1;
  }

  if (!f.json) {
    std::fputs(prompt.c_str(), stdout);
    std::fflush(stdout);
  }
  Utf8Streamer streamer;
  std::string text;
  std::vector<TokenEvent> events;
  int32_t peak_blocks = 0;  // memory over the run: flat with --kv-window
  while ((*engine)->HasUnfinished()) {
    events.clear();
    (*engine)->Step(&events);
    peak_blocks = std::max(peak_blocks, (*engine)->kv().blocks_used());
    for (const TokenEvent& ev : events) {
      if (ev.finish == FinishReason::kStop) continue;  // the stop token is not text
      std::string piece = streamer.Push(tok.TokenToPiece(ev.token));
      text += piece;
      if (!f.json) {
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      }
    }
  }
  std::string tail = streamer.Flush();
  text += tail;

  const Sequence& s = (*engine)->Get(*seq);
  if (!f.prompt_cache.empty()) {
    std::vector<int32_t> tokens = s.tokens;
    if (!f.prompt_cache_all) tokens.resize(s.n_prompt);
    if (s.finish == FinishReason::kStop && f.prompt_cache_all) tokens.pop_back();
    const Status saved = SaveSession(f.prompt_cache, **engine, s.id, tokens, s.n_cached, {});
    if (!saved.ok()) std::fprintf(stderr, "kvllm run: %s\n", saved.message().c_str());
  }
  const KVStats kv = (*engine)->kv().Stats();
  const SequenceTimings& t = s.timings;
  const double prefill_tps = t.prefill_ms > 0 ? t.prefill_tokens * 1000.0 / t.prefill_ms : 0;
  const double decode_tps = t.decode_ms > 0 ? t.decode_steps * 1000.0 / t.decode_ms : 0;
  const KVLayout& lay = (*engine)->kv().layout();
  if (f.json) {
    nlohmann::json j;
    j["prompt_tokens"] = s.n_prompt;
    j["cached_tokens"] = s.cached_tokens();
    j["generated_tokens"] = std::vector<int32_t>(s.tokens.begin() + s.n_prompt, s.tokens.end());
    j["text"] = text;
    j["finish_reason"] = FinishReasonName(s.finish);
    j["prefill_ms"] = t.prefill_ms;
    // From Add to the first token: includes reading stored KV, which prefill_ms does not.
    j["ttft_ms"] = std::chrono::duration<double, std::milli>(t.first_token - t.arrival).count();
    j["decode_ms"] = t.decode_ms;
    j["prefill_tokens_per_s"] = prefill_tps;
    j["decode_tokens_per_s"] = decode_tps;
    j["kv_cache"] = opts->kv_cache;
    j["cache_type_k"] = lay.k_format().name();
    j["cache_type_v"] = lay.v_format().name();
    j["block_size"] = lay.block_size();
    j["kv_bytes_per_token"] = kv.bytes_per_token;
    j["kv_bytes_used"] = kv.bytes_used;
    j["kv_bytes_allocated"] = kv.bytes_allocated;
    j["kv_window"] = (*engine)->kv().window().window;
    j["kv_sinks"] = (*engine)->kv().window().sinks;
    j["kv_blocks_used"] = kv.blocks_used;
    j["kv_blocks_peak"] = peak_blocks;
    j["kv_bytes_peak"] = static_cast<uint64_t>(peak_blocks) * kv.bytes_per_block;
    j["kv_blocks_total"] = kv.blocks_total;
    j["kv_tokens_stored"] = kv.tokens_stored;
    std::cout << j.dump() << std::endl;
    return 0;
  }
  std::fputs(tail.c_str(), stdout);
  std::fputs("\n\n", stdout);
  std::fflush(stdout);
  std::fprintf(stderr,
               "prompt:   %d tokens (%d from the cache), prefill %.1f ms (%.1f tokens/s; time to "
               "first token)\n",
               s.n_prompt, s.cached_tokens(), t.prefill_ms, prefill_tps);
  std::fprintf(stderr, "decode:   %d tokens in %.1f ms (%.2f tokens/s)%s, stop: %s\n",
               t.decode_steps, t.decode_ms, decode_tps,
               opts->kv_cache ? "" : " [--no-kv-cache: full recompute per token]",
               FinishReasonName(s.finish));
  const KVWindow& window = (*engine)->kv().window();
  if (window.enabled()) {
    std::fprintf(stderr, "window:   last %d tokens + %d sinks attended; older blocks released\n",
                 window.window, window.sinks);
  }
  std::fprintf(stderr,
               "kv cache: K %s / V %s, %s bytes per token, block %d tokens; %d of %d blocks in "
               "use (%s of %s; peak %d), %lld tokens stored, fragmentation %.1f%%\n",
               lay.k_format().name(), lay.v_format().name(),
               WithCommas(kv.bytes_per_token).c_str(), lay.block_size(), kv.blocks_used,
               kv.blocks_total, FormatBytes(kv.bytes_used).c_str(),
               FormatBytes(kv.bytes_allocated).c_str(), peak_blocks,
               static_cast<long long>(kv.tokens_stored),
               kv.fragmentation * 100);
  return 0;
}

}  // namespace

Command RegisterRun(CLI::App* app) {
  auto f = std::make_shared<RunFlags>();
  CLI::App* sub = app->add_subcommand("run", "generate text from a prompt");
  sub->add_option("-m,--model", f->model_path, "GGUF model file")->required();
  auto* p = sub->add_option("-p,--prompt", f->prompt, "prompt text");
  sub->add_option("-f,--file", f->prompt_file, "read the prompt from a file")->excludes(p);
  sub->add_option("-n,--n-predict", f->n_predict, "tokens to generate (-1: until the cache is full)")
      ->capture_default_str();
  f->sampling.Register(sub);
  sub->add_flag("--ignore-eos", f->ignore_eos, "keep generating after end-of-sequence");
  sub->add_flag("--json", f->json, "print one JSON object at the end instead of text and summary");
  sub->add_option("--prompt-cache", f->prompt_cache,
                  "reuse the KV saved in FILE for the prompt's matching prefix, then save the "
                  "prompt's KV there");
  sub->add_flag("--prompt-cache-all", f->prompt_cache_all,
                "with --prompt-cache, save the generated tokens' KV too");
  f->engine.Register(sub);
  return [f] { return Run(*f); };
}

}  // namespace kvllm::cli
