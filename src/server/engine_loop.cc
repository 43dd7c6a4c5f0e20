#include "server/engine_loop.h"

#include <algorithm>
#include <future>

namespace kvllm::server {
namespace {

using Clock = std::chrono::steady_clock;

double Seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }

std::string ReasonName(FinishReason r) {
  switch (r) {
    case FinishReason::kStop: return "stop";
    case FinishReason::kLength:
    case FinishReason::kContext: return "length";
    case FinishReason::kAbort: return "abort";
    case FinishReason::kNone: break;
  }
  return "";
}

// The longest tail of `text` that begins some stop string: it may not be sent yet.
size_t HeldBack(const std::string& text, const std::vector<std::string>& stops) {
  size_t hold = 0;
  for (const std::string& stop : stops) {
    for (size_t k = std::min(stop.size() - 1, text.size()); k > hold; --k) {
      if (text.compare(text.size() - k, k, stop, 0, k) == 0) {
        hold = k;
        break;
      }
    }
  }
  return hold;
}

ApiError ShuttingDown() {
  ApiError e;
  e.status = 503;
  e.type = "server_error";
  e.message = "the server is shutting down";
  return e;
}

}  // namespace

RequestStream::State RequestStream::Wait(std::chrono::milliseconds timeout,
                                         std::vector<ChoiceDelta>* out) {
  std::unique_lock lock(mu_);
  cv_.wait_for(lock, timeout, [&] { return state_ != State::kPending && (!deltas_.empty() ||
                                                                       state_ != State::kRunning); });
  for (ChoiceDelta& d : deltas_) out->push_back(std::move(d));
  deltas_.clear();
  return state_;
}

Usage RequestStream::usage() const {
  std::lock_guard lock(mu_);
  return usage_;
}

void RequestStream::Accept() {
  std::lock_guard lock(mu_);
  state_ = State::kRunning;
  cv_.notify_all();
}

void RequestStream::Reject(ApiError e) {
  std::lock_guard lock(mu_);
  error_ = std::move(e);
  state_ = State::kRejected;
  cv_.notify_all();
}

void RequestStream::Push(ChoiceDelta d) {
  std::lock_guard lock(mu_);
  deltas_.push_back(std::move(d));
  cv_.notify_all();
}

void RequestStream::Done(Usage u) {
  std::lock_guard lock(mu_);
  usage_ = u;
  state_ = State::kDone;
  cv_.notify_all();
}

EngineLoop::EngineLoop(Engine* engine, const Tokenizer* tokenizer, Metrics* metrics,
                       LoopOptions options)
    : engine_(engine), tokenizer_(tokenizer), metrics_(metrics), options_(options) {
  thread_ = std::thread([this] { Run(); });
}

EngineLoop::~EngineLoop() { Stop(); }

void EngineLoop::Stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::shared_ptr<RequestStream> EngineLoop::Submit(SubmitParams params) {
  auto stream = std::make_shared<RequestStream>();
  {
    std::lock_guard lock(mu_);
    if (!stopping_) {
      inbox_.push_back([this, p = std::move(params), stream]() mutable {
        StartRequest(std::move(p), stream);
      });
      cv_.notify_all();
      return stream;
    }
  }
  stream->Reject(ShuttingDown());
  return stream;
}

void EngineLoop::Cancel(const std::shared_ptr<RequestStream>& stream) {
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    inbox_.push_back([this, stream] { CancelRequest(stream); });
  }
  cv_.notify_all();
}

void EngineLoop::RunOnLoop(std::function<void()> fn) {
  std::promise<void> done;
  std::future<void> finished = done.get_future();
  {
    std::lock_guard lock(mu_);
    if (stopping_) return;
    inbox_.push_back([&] {
      fn();
      done.set_value();
    });
  }
  cv_.notify_all();
  finished.wait();
}

void EngineLoop::Run() {
  std::vector<TokenEvent> events;
  while (true) {
    std::deque<std::function<void()>> tasks;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !inbox_.empty() || engine_->HasUnfinished(); });
      if (stopping_) break;
      tasks.swap(inbox_);
    }
    for (auto& task : tasks) task();
    if (!engine_->HasUnfinished()) continue;
    events.clear();
    engine_->Step(&events);
    for (const TokenEvent& ev : events) {
      auto it = by_seq_.find(ev.seq.value);
      if (it != by_seq_.end()) OnToken(*it->second.first, it->second.second, ev);
    }
    // The scheduler ends a sequence that can never fit without a token.
    for (auto it = active_.begin(); it != active_.end();) {
      auto next = std::next(it);
      for (size_t i = 0; i < it->choices.size(); ++i) {
        const Choice& c = it->choices[i];
        if (!c.done && engine_->Get(c.seq).finished()) {
          FinishChoice(*it, static_cast<int32_t>(i), ReasonName(engine_->Get(c.seq).finish));
        }
      }
      CompleteIfDone(it);
      it = next;
    }
  }
  // Stopping: what was queued is refused, what runs ends.
  std::deque<std::function<void()>> tasks;
  {
    std::lock_guard lock(mu_);
    tasks.swap(inbox_);
  }
  for (auto& task : tasks) task();
  while (!active_.empty()) CancelRequest(active_.front().stream);
}

void EngineLoop::StartRequest(SubmitParams params, std::shared_ptr<RequestStream> stream) {
  ApiError e;
  bool stopping;
  {
    std::lock_guard lock(mu_);
    stopping = stopping_;
  }
  if (stopping) {
    stream->Reject(ShuttingDown());
    return;
  }
  if (engine_->scheduler().num_waiting() >= options_.max_waiting) {
    e.status = 503;
    e.type = "server_error";
    e.message = "the server is busy: " + std::to_string(engine_->scheduler().num_waiting()) +
                " requests are waiting; retry later";
    metrics_->RecordRejected(e.status);
    stream->Reject(e);
    return;
  }
  auto first = engine_->Add(params.request);
  if (!first.ok()) {
    e.message = first.status().message();
    if (e.message.find("-c/--ctx-size") != std::string::npos) e.code = "context_length_exceeded";
    metrics_->RecordRejected(e.status);
    stream->Reject(e);
    return;
  }
  Active& a = active_.emplace_back();
  a.stream = stream;
  a.arrival = Clock::now();
  a.choices.resize(params.request.n);
  for (int32_t i = 0; i < params.request.n; ++i) {
    a.choices[i].seq = SeqId(first->value + i);
    by_seq_[first->value + i] = {&a, i};
  }
  metrics_->RecordPromptTokens(static_cast<int64_t>(params.request.prompt.size()));
  a.params = std::move(params);
  stream->Accept();
}

void EngineLoop::OnToken(Active& a, int32_t index, const TokenEvent& ev) {
  Choice& c = a.choices[index];
  if (c.done) return;
  const auto now = Clock::now();
  if (!a.first_token) {
    a.first_token = true;
    metrics_->RecordTtft(Seconds(now - a.arrival));
    const auto scheduled = engine_->Get(c.seq).timings.scheduled;
    metrics_->RecordQueueTime(Seconds(std::max(scheduled, a.arrival) - a.arrival));
  } else if (c.generated > 0) {
    metrics_->RecordInterToken(Seconds(now - c.last_token));
  }
  c.last_token = now;
  if (ev.finish != FinishReason::kStop) {  // a stop token is not text
    c.text += c.utf8.Push(tokenizer_->TokenToPiece(ev.token));
    ++c.generated;
    metrics_->RecordGenerationTokens(1);
  }
  if (ev.finish != FinishReason::kNone) c.text += c.utf8.Flush();
  // A stop string ends the choice before it; it may have begun in text already held back.
  size_t cut = std::string::npos;
  for (const std::string& stop : a.params.stop) {
    const size_t from = c.sent >= stop.size() ? c.sent - stop.size() + 1 : 0;
    cut = std::min(cut, c.text.find(stop, from));
  }
  if (cut != std::string::npos) {
    c.text.resize(cut);
    engine_->Finish(c.seq, FinishReason::kStop);
    FinishChoice(a, index, "stop");
    return;
  }
  if (ev.finish != FinishReason::kNone) {
    FinishChoice(a, index, ReasonName(ev.finish));
    return;
  }
  const size_t ready = c.text.size() - HeldBack(c.text, a.params.stop);
  if (ready > c.sent) {
    a.stream->Push(ChoiceDelta{index, c.text.substr(c.sent, ready - c.sent), ""});
    c.sent = ready;
  }
}

void EngineLoop::FinishChoice(Active& a, int32_t index, const std::string& reason) {
  Choice& c = a.choices[index];
  c.done = true;
  a.stream->Push(ChoiceDelta{index, c.text.substr(std::min(c.sent, c.text.size())), reason});
  c.sent = c.text.size();
  metrics_->RecordFinished(reason);
  if (index == 0) {
    const Sequence& s = engine_->Get(c.seq);
    a.cached_tokens = s.cached_tokens();
    if (recent_.size() >= options_.recent_requests) recent_.pop_front();
    recent_.push_back(Recent{a.params.request_id, s.n_prompt, s.timings.prefill_tokens, s.prefix});
  }
  engine_->Release(c.seq);
  by_seq_.erase(c.seq.value);
}

void EngineLoop::CompleteIfDone(std::list<Active>::iterator it) {
  if (!std::all_of(it->choices.begin(), it->choices.end(), [](const Choice& c) { return c.done; })) {
    return;
  }
  Usage u;
  u.prompt_tokens = static_cast<int32_t>(it->params.request.prompt.size());
  for (const Choice& c : it->choices) u.completion_tokens += c.generated;
  u.cached_tokens = it->cached_tokens;
  metrics_->RecordE2e(Seconds(Clock::now() - it->arrival));
  it->stream->Done(u);
  active_.erase(it);
}

void EngineLoop::CancelRequest(const std::shared_ptr<RequestStream>& stream) {
  auto it = std::find_if(active_.begin(), active_.end(),
                         [&](const Active& a) { return a.stream == stream; });
  if (it == active_.end()) return;  // already finished
  for (size_t i = 0; i < it->choices.size(); ++i) {
    if (it->choices[i].done) continue;
    engine_->Finish(it->choices[i].seq, FinishReason::kAbort);
    FinishChoice(*it, static_cast<int32_t>(i), "abort");
  }
  CompleteIfDone(it);
}

GaugeSnapshot EngineLoop::Gauges() {
  GaugeSnapshot g;
  RunOnLoop([&] {
    const KVStats st = engine_->kv().Stats();
    const SchedulerCounters& c = engine_->scheduler().counters();
    g.running = engine_->scheduler().num_running();
    g.waiting = engine_->scheduler().num_waiting();
    g.blocks_total = st.blocks_total;
    g.blocks_used = st.blocks_used;
    g.blocks_cached_free = st.blocks_cached_free;
    g.kv_usage = st.blocks_total == 0 ? 0 : static_cast<double>(st.blocks_used) / st.blocks_total;
    g.prefix_queries = c.prefix_queries;
    g.prefix_hits = c.prefix_hits;
    g.preemptions = c.preemptions;
    g.evictions = engine_->kv().prefix_cache().evictions();
    if (engine_->store() != nullptr) g.tiers = engine_->store()->stats();
  });
  return g;
}

nlohmann::json EngineLoop::KvJson() {
  using nlohmann::json;
  json j;
  RunOnLoop([&] {
    const KVCache& kv = engine_->kv();
    const KVStats st = kv.Stats();
    const SchedulerCounters& c = engine_->scheduler().counters();
    const std::string problem = kv.CheckIntegrity();
    j["block_size"] = st.block_size;
    j["bytes_per_block"] = st.bytes_per_block;
    j["k_type"] = kv.layout().k_format().name();
    j["v_type"] = kv.layout().v_format().name();
    j["blocks"] = {{"total", st.blocks_total},
                   {"used", st.blocks_used},
                   {"cached_free", st.blocks_cached_free},
                   {"free", st.blocks_free}};
    j["tokens_stored"] = st.tokens_stored;
    j["fragmentation"] = st.fragmentation;
    j["integrity"] = problem.empty() ? "ok" : problem;
    j["preemptions"] = c.preemptions;
    j["prefix_cache"] = {
        {"enabled", kv.prefix_cache_enabled()},
        {"queried_tokens", c.prefix_queries},
        {"hit_tokens", c.prefix_hits},
        {"hit_rate", c.prefix_queries == 0 ? 0.0
                                           : static_cast<double>(c.prefix_hits) / c.prefix_queries},
        {"cached_blocks", kv.prefix_cache().num_indexed()},
        {"evictions", kv.prefix_cache().evictions()}};
    json requests = json::array();
    for (const Active& a : active_) {
      json choices = json::array();
      for (const Choice& ch : a.choices) {
        if (ch.done) continue;
        const Sequence& s = engine_->Get(ch.seq);
        json table = json::array();
        if (kv.Has(ch.seq)) {
          for (BlockId b : kv.Table(ch.seq).blocks) table.push_back(b.value);
        }
        choices.push_back({{"seq", ch.seq.value},
                           {"tokens", s.tokens.size()},
                           {"computed_tokens", s.n_cached},
                           {"block_table", table}});
      }
      const int32_t cached = a.choices[0].done ? a.cached_tokens
                                               : engine_->Get(a.choices[0].seq).cached_tokens();
      requests.push_back({{"id", a.params.request_id},
                          {"prompt_tokens", a.params.request.prompt.size()},
                          {"cached_tokens", cached},
                          {"choices", choices}});
    }
    j["requests"] = requests;
    json tiers = json::array();
    if (engine_->store() != nullptr) {
      for (const TierStats& t : engine_->store()->stats()) {
        tiers.push_back({{"tier", t.name}, {"hits", t.hits}, {"misses", t.misses},
                         {"errors", t.errors}, {"rejected", t.rejected}, {"writes", t.writes}});
      }
    }
    j["store"] = tiers;
    json recent = json::array();
    for (const Recent& r : recent_) {
      json m = {{"id", r.request_id},
                {"prompt_tokens", r.prompt_tokens},
                {"cached_tokens", r.prefix.tokens},
                {"stored_tokens", r.prefix.stored_tokens},
                {"prefilled_tokens", r.prefilled_tokens},
                {"miss", PrefixMissName(r.prefix.miss)}};
      if (r.prefix.miss_block >= 0) {
        m["miss_block"] = r.prefix.miss_block;
        m["miss_token"] = r.prefix.miss_block * st.block_size;
      }
      recent.push_back(m);
    }
    j["recent"] = recent;
  });
  return j;
}

}  // namespace kvllm::server
