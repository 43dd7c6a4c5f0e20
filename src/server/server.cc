#include "server/server.h"

#include <algorithm>
#include <sys/socket.h>

#include <ctime>
#include <thread>

#include <httplib.h>

namespace kvllm::server {
namespace {

using nlohmann::json;
using namespace std::chrono_literals;

void ReplyError(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(ErrorJson(e), "application/json");
}

json UsageJson(const Usage& u) {
  return {{"prompt_tokens", u.prompt_tokens},
          {"completion_tokens", u.completion_tokens},
          {"total_tokens", u.prompt_tokens + u.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", u.cached_tokens}}}};
}

json FinishJson(const std::string& reason) { return reason.empty() ? json(nullptr) : json(reason); }

// What a streaming response needs between provider calls.
struct StreamState {
  std::shared_ptr<RequestStream> stream;
  bool chat = false;
  bool include_usage = false;
  std::string id;
  std::string model;
  int64_t created = 0;
  std::vector<bool> role_sent;
};

}  // namespace

Server::Server(ServerOptions options, EngineLoop* loop, Metrics* metrics,
               const Tokenizer* tokenizer, ChatTemplate chat_template, int32_t max_num_seqs)
    : options_(std::move(options)),
      loop_(loop),
      metrics_(metrics),
      tokenizer_(tokenizer),
      template_(chat_template),
      http_(std::make_unique<httplib::Server>()) {
  // Each streaming request holds an HTTP thread: leave room for a full batch and then some.
  const int32_t threads =
      options_.http_threads > 0 ? options_.http_threads : std::max(8, max_num_seqs + 8);
  http_->new_task_queue = [threads] { return new httplib::ThreadPool(threads); };
  http_->set_payload_max_length(options_.max_body_bytes);
  // httplib's default options set SO_REUSEPORT, which lets a second server take the same port
  // and split the traffic silently; SO_REUSEADDR alone only allows a quick restart.
  http_->set_socket_options([this](socket_t fd) {
    int yes = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
    listen_fd_ = fd;
  });
  Routes();
}

Server::~Server() = default;

Status Server::Bind() {
  if (options_.port == 0) {
    port_ = http_->bind_to_any_port(options_.host);
    if (port_ < 0) port_ = 0;
  } else if (http_->bind_to_port(options_.host, options_.port)) {
    port_ = options_.port;
  }
  if (port_ <= 0) {
    return Status::Error("cannot listen on " + options_.host + ":" +
                         std::to_string(options_.port) + " (in use, or not an address here)");
  }
  // httplib listens with a backlog of 5: a burst of clients (32 streams at once) overflows it
  // and the kernel resets connections. Listening again on the socket raises the backlog.
  if (listen_fd_ >= 0) ::listen(listen_fd_, SOMAXCONN);
  return Status::Ok();
}

void Server::Serve() {
  if (!stop_requested_) http_->listen_after_bind();
  served_ = true;
}

void Server::Stop() {
  stop_requested_ = true;
  // httplib's stop() does nothing until its listen loop has started: a signal between Bind()
  // and that moment would be lost and Serve() would never return. So wait for the loop, unless
  // Serve() saw the request first and returned.
  while (!http_->is_running() && !served_) std::this_thread::sleep_for(1ms);
  if (!served_) http_->stop();
}

bool Server::Authorized(const std::string& header) const {
  if (options_.api_key.empty()) return true;
  const std::string want = "Bearer " + options_.api_key;
  // Constant time in the key: every byte is compared whatever the first difference.
  unsigned diff = header.size() == want.size() ? 0 : 1;
  for (size_t i = 0; i < want.size(); ++i) {
    diff |= static_cast<unsigned char>(want[i]) ^
            static_cast<unsigned char>(i < header.size() ? header[i] : 0);
  }
  return diff == 0;
}

void Server::Routes() {
  const int64_t started = std::time(nullptr);
  http_->set_pre_routing_handler([this](const httplib::Request& req, httplib::Response& res) {
    if (req.path.rfind("/v1/", 0) == 0 && !Authorized(req.get_header_value("Authorization"))) {
      ApiError e;
      e.status = 401;
      e.message = "invalid or missing API key (Authorization: Bearer KEY)";
      e.code = "invalid_api_key";
      metrics_->RecordRejected(401);
      ReplyError(res, e);
      return httplib::Server::HandlerResponse::Handled;
    }
    return httplib::Server::HandlerResponse::Unhandled;
  });
  http_->set_error_handler(httplib::Server::HandlerWithResponse(
      [](const httplib::Request& req, httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    ApiError e;
    e.status = res.status;
    e.message = res.status == 404   ? "no route " + req.method + " " + req.path
                : res.status == 413 ? "the request body is too large"
                                    : "HTTP error " + std::to_string(res.status);
    ReplyError(res, e);
    return httplib::Server::HandlerResponse::Handled;
  }));
  http_->set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        ApiError e;
        e.status = 500;
        e.type = "server_error";
        try {
          std::rethrow_exception(ep);
        } catch (const std::exception& ex) {
          e.message = ex.what();
        } catch (...) {
          e.message = "internal error";
        }
        ReplyError(res, e);
      });

  http_->Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content(R"({"status":"ok"})", "application/json");
  });
  http_->Get("/v1/models", [this, started](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", options_.model_name},
              {"object", "model"},
              {"created", started},
              {"owned_by", "kvllm"}};
    res.set_content(DumpJson(json{{"object", "list"}, {"data", json::array({m})}}),
                    "application/json");
  });
  http_->Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(metrics_->Render(loop_->Gauges()), "text/plain; version=0.0.4");
  });
  http_->Get("/kv", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(DumpJson(loop_->KvJson()), "application/json");
  });
  http_->Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(req.body, /*chat=*/false, &res);
  });
  http_->Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    HandleGenerate(req.body, /*chat=*/true, &res);
  });
}

void Server::HandleGenerate(const std::string& body, bool chat, void* response) {
  httplib::Response& res = *static_cast<httplib::Response*>(response);
  CompletionParams p;
  if (auto e = ParseCompletionRequest(body, chat, options_.limits, &p)) {
    metrics_->RecordRejected(e->status);
    ReplyError(res, *e);
    return;
  }
  SubmitParams sp;
  sp.request_id = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(next_id_++);
  Request& r = sp.request;
  if (chat) {
    r.prompt = tokenizer_->Encode(template_.Apply(p.messages, /*add_generation_prompt=*/true),
                                  /*add_special=*/true, /*parse_special=*/true);
  } else if (!p.prompt_tokens.empty()) {
    r.prompt = p.prompt_tokens;
  } else {
    r.prompt = tokenizer_->Encode(p.prompt, /*add_special=*/true);
  }
  r.n = p.n;
  r.params.max_tokens = p.max_tokens;
  SamplingParams& s = r.params.sampling;
  s.temperature = p.temperature;
  s.top_k = std::max(p.top_k, 0);
  s.top_p = p.top_p;
  s.min_p = p.min_p;
  s.repeat_penalty = p.repetition_penalty;
  s.seed = p.seed.value_or(SamplingParams::kRandomSeed);
  if (!p.ignore_eos) r.params.stop_tokens = tokenizer_->EogTokens();
  sp.stop = p.stop;
  const std::string id = sp.request_id;
  const int32_t n = r.n;

  std::shared_ptr<RequestStream> stream = loop_->Submit(std::move(sp));
  std::vector<ChoiceDelta> deltas;
  RequestStream::State state;
  while ((state = stream->Wait(1000ms, &deltas)) == RequestStream::State::kPending) {
  }
  if (state == RequestStream::State::kRejected) {
    ReplyError(res, stream->error());
    return;
  }
  const int64_t created = std::time(nullptr);
  if (!p.stream) {
    while (state != RequestStream::State::kDone) state = stream->Wait(1000ms, &deltas);
    std::vector<std::string> texts(n), reasons(n);
    for (const ChoiceDelta& d : deltas) {
      texts[d.index] += d.text;
      if (!d.finish_reason.empty()) reasons[d.index] = d.finish_reason;
    }
    json choices = json::array();
    for (int32_t i = 0; i < n; ++i) {
      json c = {{"index", i}, {"logprobs", nullptr}, {"finish_reason", FinishJson(reasons[i])}};
      if (chat) {
        c["message"] = {{"role", "assistant"}, {"content", texts[i]}};
      } else {
        c["text"] = texts[i];
      }
      choices.push_back(c);
    }
    json out = {{"id", id},
                {"object", chat ? "chat.completion" : "text_completion"},
                {"created", created},
                {"model", options_.model_name},
                {"choices", choices},
                {"usage", UsageJson(stream->usage())}};
    res.set_content(DumpJson(out), "application/json");
    return;
  }

  auto st = std::make_shared<StreamState>();
  st->stream = stream;
  st->chat = chat;
  st->include_usage = p.include_usage;
  st->id = id;
  st->model = options_.model_name;
  st->created = created;
  st->role_sent.assign(n, false);
  auto pending = std::make_shared<std::vector<ChoiceDelta>>(std::move(deltas));
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider(
      "text/event-stream",
      [this, st, pending](size_t, httplib::DataSink& sink) {
        auto chunk = [&](json choices, json usage) {
          json j = {{"id", st->id},
                    {"object", st->chat ? "chat.completion.chunk" : "text_completion"},
                    {"created", st->created},
                    {"model", st->model},
                    {"choices", std::move(choices)}};
          if (st->include_usage) j["usage"] = std::move(usage);
          const std::string line = "data: " + DumpJson(j) + "\n\n";
          return sink.write(line.data(), line.size());
        };
        auto choice = [&](int32_t index, const std::string& text, const std::string& reason) {
          json c = {{"index", index}, {"logprobs", nullptr}, {"finish_reason", FinishJson(reason)}};
          if (st->chat) {
            c["delta"] = text.empty() && !reason.empty() ? json::object() : json{{"content", text}};
          } else {
            c["text"] = text;
          }
          return c;
        };
        std::vector<ChoiceDelta> deltas = std::move(*pending);
        pending->clear();
        auto last_write = std::chrono::steady_clock::now();
        while (true) {
          const RequestStream::State state = st->stream->Wait(100ms, &deltas);
          for (const ChoiceDelta& d : deltas) {
            bool ok = true;
            if (st->chat && !st->role_sent[d.index]) {
              st->role_sent[d.index] = true;
              json c = {{"index", d.index},
                        {"delta", {{"role", "assistant"}, {"content", ""}}},
                        {"logprobs", nullptr},
                        {"finish_reason", nullptr}};
              ok = chunk(json::array({c}), nullptr);
            }
            if (ok && !d.text.empty()) ok = chunk(json::array({choice(d.index, d.text, "")}), nullptr);
            if (ok && !d.finish_reason.empty()) {
              ok = chunk(json::array({choice(d.index, "", d.finish_reason)}), nullptr);
            }
            if (!ok) {
              loop_->Cancel(st->stream);
              return false;
            }
            last_write = std::chrono::steady_clock::now();
          }
          deltas.clear();
          if (state == RequestStream::State::kDone) {
            if (st->include_usage && !chunk(json::array(), UsageJson(st->stream->usage()))) {
              return false;
            }
            static const std::string kDone = "data: [DONE]\n\n";
            sink.write(kDone.data(), kDone.size());
            sink.done();
            return true;
          }
          // Long silences (a long prefill, a full queue): a comment line keeps proxies from
          // timing out and tells us whether the client is still there.
          if (std::chrono::steady_clock::now() - last_write > 1s) {
            static const std::string kKeepAlive = ": keep-alive\n\n";
            if (!sink.write(kKeepAlive.data(), kKeepAlive.size())) {
              loop_->Cancel(st->stream);
              return false;
            }
            last_write = std::chrono::steady_clock::now();
          }
        }
      },
      [this, st](bool success) {
        if (!success) loop_->Cancel(st->stream);
      });
}

}  // namespace kvllm::server
