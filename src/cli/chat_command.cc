// `kvllm chat`: an interactive conversation in which every turn prefills only the new message.
// The KV of earlier turns stays in the cache: the conversation is one engine sequence that is
// continued turn after turn. `--no-kv-reuse` re-prefills the whole history each turn instead,
// for comparison; both feed the model the same tokens.
#include <unistd.h>

#include <cstdio>
#include <iostream>
#include <string>

#include "cli/commands.h"
#include "cli/common.h"
#include "cli/session.h"
#include "tokenizer/chat_template.h"

namespace kvllm::cli {
namespace {

struct ChatFlags {
  std::string model_path;
  std::string system;
  std::string chat_template;
  std::string session;  // file the conversation is saved to and restored from
  int32_t n_predict = 256;
  SamplingFlags sampling;
  bool no_kv_reuse = false;
  EngineFlags engine;
};

class ChatSession {
 public:
  ChatSession(const ChatFlags& flags, const Tokenizer& tok, Engine& engine, ChatTemplate tmpl)
      : flags_(flags), tok_(tok), engine_(engine), tmpl_(tmpl) {
    Reset();
  }

  void Reset() {
    if (seq_) engine_.Release(*seq_);
    seq_.reset();
    restored_.clear();
    messages_.clear();
    cached_text_.clear();
    if (!flags_.system.empty()) messages_.push_back({"system", flags_.system});
  }

  // Continues a conversation saved by an earlier run: its KV is in the prefix cache already.
  void Restore(const RestoredSession& r) {
    Reset();
    messages_.clear();
    for (const auto& m : r.extra.value("messages", nlohmann::json::array())) {
      messages_.push_back({m.value("role", ""), m.value("content", "")});
    }
    cached_text_ = r.extra.value("text", "");
    restored_ = r.tokens;
  }

  // Runs one user turn; returns false when the engine refused it (the error is printed).
  bool Turn(const std::string& user) {
    messages_.push_back({"user", user});
    const std::string full = tmpl_.Apply(messages_, /*add_generation_prompt=*/true);
    // The rendered conversation extends what the cache holds: feed only the difference.
    const bool extends = (seq_ || !restored_.empty()) &&
                         full.compare(0, cached_text_.size(), cached_text_) == 0;
    int32_t reused = 0;
    Status status;
    if (extends && !seq_) {
      // A restored conversation: its tokens, then the new text; the prefix cache has its KV.
      Request req;
      req.prompt = restored_;
      const std::vector<int32_t> delta = tok_.Encode(full.substr(cached_text_.size()),
                                                     /*add_special=*/false, /*parse_special=*/true);
      req.prompt.insert(req.prompt.end(), delta.begin(), delta.end());
      req.params = Params();
      auto id = engine_.Add(std::move(req));
      if (id.ok()) seq_ = *id;
      status = id.status();
      restored_.clear();
    } else if (extends) {
      const std::vector<int32_t> delta = tok_.Encode(full.substr(cached_text_.size()),
                                                     /*add_special=*/false, /*parse_special=*/true);
      reused = flags_.no_kv_reuse ? 0 : engine_.Get(*seq_).n_cached;
      status = engine_.Continue(*seq_, delta, flags_.n_predict, !flags_.no_kv_reuse);
    } else {
      if (seq_) engine_.Release(*seq_);
      seq_.reset();
      Request req;
      req.prompt = tok_.Encode(full, /*add_special=*/true, /*parse_special=*/true);
      req.params = Params();
      auto id = engine_.Add(std::move(req));
      if (id.ok()) seq_ = *id;
      status = id.status();
    }
    if (!status.ok()) {
      std::fprintf(stderr, "kvllm chat: %s (use /reset to start over)\n", status.message().c_str());
      messages_.pop_back();
      return false;
    }

    Utf8Streamer streamer;
    std::string reply;
    std::vector<TokenEvent> events;
    while (engine_.HasUnfinished()) {
      events.clear();
      engine_.Step(&events);
      for (const TokenEvent& ev : events) {
        if (ev.finish == FinishReason::kStop) continue;
        const std::string piece = streamer.Push(tok_.TokenToPiece(ev.token));
        reply += piece;
        std::fputs(piece.c_str(), stdout);
        std::fflush(stdout);
      }
    }
    const std::string tail = streamer.Flush();
    reply += tail;
    std::fputs((tail + "\n").c_str(), stdout);
    std::fflush(stdout);

    const Sequence& s = engine_.Get(*seq_);
    messages_.push_back({"assistant", reply});
    cached_text_ = full + reply;
    if (s.prefix_looked_up) reused = s.cached_tokens();  // a new sequence: its prefix hit
    if (!flags_.session.empty()) Save(s);
    const SequenceTimings& t = s.timings;
    std::fprintf(stderr,
                 "[reused %d tokens from cache, prefilled %d tokens in %.1f ms, decode %.2f "
                 "tokens/s, %d tokens in the conversation]\n",
                 reused, t.prefill_tokens, t.prefill_ms,
                 t.decode_ms > 0 ? t.decode_steps * 1000.0 / t.decode_ms : 0.0,
                 static_cast<int32_t>(s.tokens.size()));
    return true;
  }

  void PrintStats() const {
    const KVStats kv = engine_.kv().Stats();
    std::fprintf(stderr,
                 "[%zu messages; KV cache: %lld tokens stored, %d of %d blocks in use (%s), %s "
                 "bytes per token]\n",
                 messages_.size(), static_cast<long long>(kv.tokens_stored), kv.blocks_used,
                 kv.blocks_total, FormatBytes(static_cast<double>(kv.bytes_used)).c_str(),
                 WithCommas(kv.bytes_per_token).c_str());
  }

 private:
  // Saved after every turn, so that a crash loses at most the turn in progress.
  void Save(const Sequence& s) const {
    std::vector<int32_t> tokens = s.tokens;
    if (s.finish == FinishReason::kStop) tokens.pop_back();  // a stop token is never fed
    nlohmann::json messages = nlohmann::json::array();
    for (const ChatMessage& m : messages_) {
      messages.push_back({{"role", m.role}, {"content", m.content}});
    }
    const Status st = SaveSession(flags_.session, engine_, s.id, tokens, s.n_cached,
                                  {{"messages", messages}, {"text", cached_text_}});
    if (!st.ok()) std::fprintf(stderr, "kvllm chat: %s\n", st.message().c_str());
  }

  GenerationParams Params() const {
    GenerationParams p;
    p.max_tokens = flags_.n_predict;
    p.stop_tokens = tok_.EogTokens();
    p.sampling = flags_.sampling.ToParams();
    return p;
  }

  const ChatFlags& flags_;
  const Tokenizer& tok_;
  Engine& engine_;
  const ChatTemplate tmpl_;
  std::optional<SeqId> seq_;
  std::vector<int32_t> restored_;  // a restored conversation's tokens, until its next turn
  std::vector<ChatMessage> messages_;
  std::string cached_text_;  // the conversation text whose tokens the sequence holds
};

int Chat(const ChatFlags& f) {
  auto loaded = LoadModel(f.model_path, f.engine.load_options());
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvllm chat: %s\n", loaded.status().message().c_str());
    return 1;
  }
  auto tmpl = ResolveChatTemplate(*loaded->model, f.chat_template);
  if (!tmpl.ok()) {
    std::fprintf(stderr, "kvllm chat: %s\n", tmpl.status().message().c_str());
    return 1;
  }
  auto opts = f.engine.ToOptions(*loaded->model);
  if (!opts.ok()) {
    std::fprintf(stderr, "kvllm chat: %s\n", opts.status().message().c_str());
    return 1;
  }
  auto engine = Engine::Create(loaded->model.get(), *opts);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvllm chat: %s\n", engine.status().message().c_str());
    return 1;
  }
  const bool interactive = isatty(STDIN_FILENO);
  std::fprintf(stderr,
               "kvllm chat: template %s, KV cache of %lld tokens%s. Commands: /reset, /stats, "
               "/quit\n",
               tmpl->name(), static_cast<long long>((*engine)->kv().capacity_tokens()),
               f.no_kv_reuse ? ", re-prefilling the history every turn (--no-kv-reuse)" : "");
  ChatSession session(f, *loaded->tokenizer, **engine, *tmpl);
  if (!f.session.empty()) {
    auto restored = RestoreSession(f.session, **engine);
    if (!restored.ok()) {
      std::fprintf(stderr, "kvllm chat: %s\n", restored.status().message().c_str());
      return 1;
    }
    if (*restored) {
      session.Restore(**restored);
      std::fprintf(stderr, "[restored session %s: %zu tokens, %d blocks of KV]\n",
                   f.session.c_str(), (*restored)->tokens.size(), (*restored)->blocks);
    } else {
      std::fprintf(stderr, "[new session %s]\n", f.session.c_str());
    }
  }
  std::string line;
  while (true) {
    if (interactive) {
      std::fputs("> ", stdout);
      std::fflush(stdout);
    }
    if (!std::getline(std::cin, line)) break;
    if (line.empty()) continue;
    if (line == "/quit" || line == "/exit") break;
    if (line == "/reset") {
      session.Reset();
      std::fprintf(stderr, "[conversation reset]\n");
      continue;
    }
    if (line == "/stats") {
      session.PrintStats();
      continue;
    }
    session.Turn(line);
  }
  return 0;
}

}  // namespace

Command RegisterChat(CLI::App* app) {
  auto f = std::make_shared<ChatFlags>();
  CLI::App* sub = app->add_subcommand("chat", "talk to a model; each turn reuses the KV of the earlier turns");
  sub->add_option("-m,--model", f->model_path, "GGUF model file")->required();
  sub->add_option("--system", f->system, "system prompt");
  sub->add_option("--chat-template", f->chat_template,
                  "chatml, llama2, llama3, mistral, zephyr, phi3, gemma (default: from the model)");
  sub->add_option("-n,--n-predict", f->n_predict, "tokens per reply at most (-1: until EOS or a full cache)")
      ->capture_default_str();
  f->sampling.Register(sub);
  sub->add_flag("--no-kv-reuse", f->no_kv_reuse, "re-prefill the whole history every turn");
  sub->add_option("--session", f->session,
                  "save the conversation and its KV to FILE after every turn, and continue it "
                  "from there when FILE exists");
  f->engine.Register(sub);
  return [f] { return Chat(*f); };
}

}  // namespace kvllm::cli
