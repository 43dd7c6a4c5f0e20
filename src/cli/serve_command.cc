// `kvllm serve`: the OpenAI-compatible server (server/server.h) over one engine with
// continuous batching and the prefix cache. Binds 127.0.0.1 unless told otherwise; SIGINT or
// SIGTERM stop it cleanly (running requests end with finish_reason "abort").
#include <pthread.h>
#include <signal.h>

#include <cstdio>
#include <filesystem>
#include <thread>

#include "cli/commands.h"
#include "cli/common.h"
#include "server/server.h"

namespace kvllm::cli {
namespace {

struct ServeFlags {
  std::string model_path;
  std::string host = "127.0.0.1";
  int port = 8080;
  std::string api_key;
  std::string alias;
  std::string chat_template;
  int32_t max_queue = 256;
  int32_t threads_http = 0;
  EngineFlags engine;
};

int Serve(const ServeFlags& f) {
  // Signals go to one waiting thread, never to a worker in the middle of a step; a client that
  // disconnects must not kill the process with SIGPIPE.
  sigset_t stop_signals;
  sigemptyset(&stop_signals);
  sigaddset(&stop_signals, SIGINT);
  sigaddset(&stop_signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &stop_signals, nullptr);
  signal(SIGPIPE, SIG_IGN);

  auto loaded = LoadModel(f.model_path, f.engine.load_options());
  if (!loaded.ok()) {
    std::fprintf(stderr, "kvllm serve: %s\n", loaded.status().message().c_str());
    return 1;
  }
  auto tmpl = ResolveChatTemplate(*loaded->model, f.chat_template);
  auto opts = f.engine.ToOptions(*loaded->model);
  if (!tmpl.ok() || !opts.ok()) {
    std::fprintf(stderr, "kvllm serve: %s\n",
                 (tmpl.ok() ? opts.status() : tmpl.status()).message().c_str());
    return 1;
  }
  if (f.max_queue < 1) {
    std::fprintf(stderr, "kvllm serve: --max-queue must be at least 1\n");
    return 1;
  }
  auto engine = Engine::Create(loaded->model.get(), *opts);
  if (!engine.ok()) {
    std::fprintf(stderr, "kvllm serve: %s\n", engine.status().message().c_str());
    return 1;
  }
  server::Metrics metrics;
  server::LoopOptions loop_opts;
  loop_opts.max_waiting = f.max_queue;
  server::EngineLoop loop(engine->get(), loaded->tokenizer.get(), &metrics, loop_opts);

  server::ServerOptions so;
  so.host = f.host;
  so.port = f.port;
  so.api_key = f.api_key;
  so.model_name =
      f.alias.empty() ? std::filesystem::path(f.model_path).stem().string() : f.alias;
  so.http_threads = f.threads_http;
  server::Server server(so, &loop, &metrics, loaded->tokenizer.get(), *tmpl,
                        opts->scheduler.max_num_seqs);
  if (Status s = server.Bind(); !s.ok()) {
    std::fprintf(stderr, "kvllm serve: %s\n", s.message().c_str());
    return 1;
  }
  const KVCache& kv = (*engine)->kv();
  std::fprintf(stderr,
               "kvllm serve: model '%s', KV cache of %s tokens (%s/%s, %d blocks of %d), "
               "prefix caching %s, chat template %s\n",
               so.model_name.c_str(), WithCommas(kv.capacity_tokens()).c_str(),
               kv.layout().k_format().name(), kv.layout().v_format().name(), kv.num_blocks(),
               kv.block_size(), kv.prefix_cache_enabled() ? "on" : "off", tmpl->name());
  if (StoreTiers* store = (*engine)->store()) {
    std::string names;
    for (const TierStats& t : store->stats()) names += (names.empty() ? "" : ", ") + t.name;
    std::fprintf(stderr, "kvllm serve: persistent KV tiers: %s\n", names.c_str());
  }
  std::fprintf(stderr, "kvllm serve: listening on http://%s:%d\n", f.host.c_str(), server.port());

  std::thread stopper([&] {
    int sig = 0;
    sigwait(&stop_signals, &sig);
    std::fprintf(stderr, "kvllm serve: stopping (signal %d)\n", sig);
    server.Stop();
  });
  server.Serve();
  // Serve() also returns if listening failed: wake the signal thread so it can finish.
  pthread_kill(stopper.native_handle(), SIGTERM);
  stopper.join();
  loop.Stop();
  // Blocks still queued for the persistent tiers are written before exit (a slow disk can
  // take a while: say so).
  if (StoreTiers* store = (*engine)->store()) {
    if (const size_t pending = store->pending(); pending > 0) {
      std::fprintf(stderr, "kvllm serve: writing %zu queued KV block%s to the store\n", pending,
                   pending == 1 ? "" : "s");
      store->Flush();
    }
  }
  std::fprintf(stderr, "kvllm serve: stopped\n");
  return 0;
}

}  // namespace

Command RegisterServe(CLI::App* app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* sub = app->add_subcommand("serve", "OpenAI-compatible HTTP server");
  sub->add_option("-m,--model", f->model_path, "GGUF model file")->required();
  sub->add_option("--host", f->host, "address to bind")->capture_default_str();
  sub->add_option("--port", f->port, "port (0: any free port)")->capture_default_str();
  sub->add_option("--api-key", f->api_key, "require 'Authorization: Bearer KEY' on /v1/*");
  sub->add_option("--alias,--served-model-name", f->alias,
                  "model name in the API (default: the file name without .gguf)");
  sub->add_option("--chat-template", f->chat_template,
                  "chat template (default: the one the model declares)");
  sub->add_option("--max-queue", f->max_queue,
                  "waiting sequences beyond which requests get 503")
      ->capture_default_str();
  sub->add_option("--threads-http", f->threads_http,
                  "HTTP worker threads (default: --max-num-seqs + 8)");
  f->engine.Register(sub);
  return [f] { return Serve(*f); };
}

}  // namespace kvllm::cli
