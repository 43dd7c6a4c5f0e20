// `kvllm bench-serve`: what paging and prefix sharing buy a server, in process (no HTTP).
//
// N closed-loop clients each send a request, wait for it to finish and send the next, until
// --requests have been served. Every request is one shared system prompt followed by a user
// part of its own, and generates exactly --max-tokens tokens (greedy, no stop token). One
// thread drives Engine::Step; a client's next request is added as soon as its previous one
// finishes and is released.
//
// The same workload runs against the same KV pool (-c / --kv-mem) under three allocation
// policies, alternating A B C A B C ... over --repetitions, medians reported:
//
//   paged+prefix  blocks on demand, full blocks of the system prompt shared (the default)
//   paged         blocks on demand, nothing shared (--no-prefix-caching)
//   reserve       a request is admitted only while the whole context it might use
//                 (--reserve-tokens, default the model's context length) can be reserved
//                 for it, as a server that allocates a contiguous cache per request does
//
// Waste is averaged over the steps that held memory: paged, the slots of blocks held by
// sequences that hold no token (KVStats::fragmentation); reserve, the reserved slots that
// hold no token. Requests per CPU-second sit beside requests/s: on a shared machine they move
// much less.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <iostream>
#include <random>
#include <sstream>
#include <thread>

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "cli/commands.h"
#include "cli/common.h"

namespace kvllm::cli {
namespace {

enum class Mode { kPagedPrefix, kPaged, kReserve };
constexpr Mode kAllModes[] = {Mode::kPagedPrefix, Mode::kPaged, Mode::kReserve};

const char* ModeName(Mode m) {
  switch (m) {
    case Mode::kPagedPrefix: return "paged+prefix";
    case Mode::kPaged: return "paged";
    case Mode::kReserve: return "reserve";
  }
  return "?";
}

struct ServeFlags {
  std::string model_path;
  int32_t clients = 32;
  int32_t requests = 128;
  int32_t system_tokens = 300;
  int32_t user_tokens = 32;
  int32_t max_tokens = 64;
  int32_t reserve_tokens = 0;  // 0: the model's context length
  int32_t repetitions = 3;
  std::string mode = "all";
  uint32_t seed = 1;
  bool json = false;
  EngineFlags engine;
};

// The prompts of every request: [requests][system_tokens + user_tokens] token ids.
struct Workload {
  std::vector<std::vector<int32_t>> prompts;
  int32_t max_tokens = 0;
};

Workload MakeWorkload(const ServeFlags& f, int32_t n_vocab) {
  // Ids 0..2 are unk/bos/eos in Llama vocabularies; ordinary tokens make an honest load.
  std::uniform_int_distribution<int32_t> dist(std::min(3, n_vocab - 1), n_vocab - 1);
  std::mt19937 rng(f.seed);
  std::vector<int32_t> system(f.system_tokens);
  for (int32_t& t : system) t = dist(rng);
  Workload w;
  w.max_tokens = f.max_tokens;
  for (int32_t r = 0; r < f.requests; ++r) {
    std::vector<int32_t> p = system;
    std::mt19937 user_rng(f.seed * 1000003u + 1 + static_cast<uint32_t>(r));
    for (int32_t i = 0; i < f.user_tokens; ++i) p.push_back(dist(user_rng));
    w.prompts.push_back(std::move(p));
  }
  return w;
}

// One run of the whole workload under one policy.
struct RunResult {
  double wall_s = 0;
  double cpu_s = 0;  // CPU time of the process (all threads): less sensitive to other load
  double requests_per_s = 0;
  double requests_per_cpu_s = 0;
  double tokens_per_s = 0;  // generated tokens
  double ttft_p50_ms = 0;
  double ttft_p99_ms = 0;
  double in_flight_mean = 0;  // sequences computed per step
  int32_t in_flight_max = 0;
  double prefix_hit_rate = 0;  // prompt tokens reused / prompt tokens looked up
  int64_t preemptions = 0;
  double waste = 0;     // see the file comment
  double pool_use = 0;  // paged: blocks held by sequences / pool; reserve: reserved / pool
  int32_t completed = 0;  // requests that generated all their tokens
  int32_t failed = 0;     // requests the engine ended early (no room)
  int64_t generated = 0;
  int64_t steps = 0;
};

// User + system CPU seconds of this process so far, all threads.
double ProcessCpuSeconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  auto sec = [](const timeval& t) { return static_cast<double>(t.tv_sec) + t.tv_usec / 1e6; };
  return sec(u.ru_utime) + sec(u.ru_stime);
}

// Nearest-rank percentile of `v` (sorted in place).
double Percentile(std::vector<double>& v, double p) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const auto rank = static_cast<size_t>(std::ceil(p / 100.0 * static_cast<double>(v.size())));
  return v[std::clamp<size_t>(rank, 1, v.size()) - 1];
}

StatusOr<RunResult> RunWorkload(Model* model, const EngineOptions& options, const Workload& w,
                                int32_t n_clients, int32_t n_requests, const std::string& label) {
  KVLLM_ASSIGN_OR_RETURN(std::unique_ptr<Engine> engine, Engine::Create(model, options));
  const bool reserve = options.scheduler.reserve_tokens > 0;
  const int32_t block_size = engine->kv().block_size();
  const int32_t n_blocks = engine->kv().num_blocks();

  std::vector<SeqId> in_flight;  // added, not yet released
  int32_t next = 0;
  auto submit = [&]() -> Status {
    Request req;
    req.prompt = w.prompts[next];
    req.params.max_tokens = w.max_tokens;
    req.params.sampling.temperature = 0;  // greedy; no stop token: every request runs to length
    KVLLM_ASSIGN_OR_RETURN(SeqId id, engine->Add(std::move(req)));
    in_flight.push_back(id);
    ++next;
    return Status::Ok();
  };

  RunResult r;
  std::vector<double> ttft_ms;
  std::vector<TokenEvent> events;
  double sum_in_flight = 0, sum_waste = 0, sum_pool_use = 0;
  int64_t waste_steps = 0;  // steps after which some memory was held
  int32_t stalled_steps = 0;
  int32_t next_progress = std::max(1, n_requests / 8);
  const auto start = std::chrono::steady_clock::now();
  const double cpu_start = ProcessCpuSeconds();
  while (next < std::min(n_clients, n_requests)) KVLLM_RETURN_IF_ERROR(submit());
  while (r.completed + r.failed < n_requests) {
    events.clear();
    engine->Step(&events);
    ++r.steps;
    // Requests that ended this step (with a token, or without one when the engine had no
    // room): record them and release their blocks.
    int32_t n_done = 0;
    for (auto it = in_flight.begin(); it != in_flight.end();) {
      const Sequence& s = engine->Get(*it);
      if (!s.finished()) {
        ++it;
        continue;
      }
      ++n_done;
      r.generated += s.n_generated();
      if (s.finish == FinishReason::kLength) {
        ++r.completed;
        ttft_ms.push_back(
            std::chrono::duration<double, std::milli>(s.timings.first_token - s.timings.arrival)
                .count());
      } else {
        ++r.failed;
      }
      engine->Release(*it);
      it = in_flight.erase(it);
    }
    // The step's sequences: those still running plus those that just finished.
    const int32_t n_step = engine->scheduler().num_running() + n_done;
    sum_in_flight += n_step;
    r.in_flight_max = std::max(r.in_flight_max, n_step);
    // Memory after the finished requests left: what the running ones hold (or reserve).
    const KVStats kv = engine->kv().Stats();
    const int32_t held_blocks = reserve ? engine->scheduler().reserved_blocks() : kv.blocks_used;
    sum_pool_use += static_cast<double>(held_blocks) / n_blocks;
    if (held_blocks > 0) {
      const int64_t held = int64_t{held_blocks} * block_size;
      // Paged, this is KVStats::fragmentation; reserve, the reserved slots holding no token.
      sum_waste += static_cast<double>(held - kv.tokens_stored) / static_cast<double>(held);
      ++waste_steps;
    }
    // A step that ran nothing while requests wait means no request can ever be admitted.
    stalled_steps = n_step == 0 && events.empty() ? stalled_steps + 1 : 0;
    if (stalled_steps > 2) {
      return Status::Error("the engine admits no request (" + label +
                           "): the KV pool is too small for one");
    }
    while (next < n_requests && static_cast<int32_t>(in_flight.size()) < n_clients) {
      KVLLM_RETURN_IF_ERROR(submit());
    }
    const int32_t n_ended = r.completed + r.failed;
    if (n_ended >= next_progress && n_ended < n_requests) {
      std::fprintf(stderr, "bench-serve: %s: %d/%d requests\n", label.c_str(), n_ended,
                   n_requests);
      while (next_progress <= n_ended) next_progress += std::max(1, n_requests / 8);
    }
  }
  r.wall_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.cpu_s = ProcessCpuSeconds() - cpu_start;
  r.requests_per_s = r.completed / r.wall_s;
  r.requests_per_cpu_s = r.cpu_s > 0 ? r.completed / r.cpu_s : 0.0;
  r.tokens_per_s = static_cast<double>(r.generated) / r.wall_s;
  r.ttft_p50_ms = Percentile(ttft_ms, 50);
  r.ttft_p99_ms = Percentile(ttft_ms, 99);
  const auto steps = static_cast<double>(std::max<int64_t>(r.steps, 1));
  r.in_flight_mean = sum_in_flight / steps;
  r.waste = waste_steps == 0 ? 0.0 : sum_waste / static_cast<double>(waste_steps);
  r.pool_use = sum_pool_use / steps;
  const SchedulerCounters& c = engine->scheduler().counters();
  r.prefix_hit_rate =
      c.prefix_queries == 0 ? 0.0 : static_cast<double>(c.prefix_hits) / c.prefix_queries;
  r.preemptions = c.preemptions;
  return r;
}

// The medians of one mode's repetitions, field by field.
struct ModeSummary {
  Mode mode;
  std::vector<RunResult> runs;
  Spread Of(double RunResult::*field) const {
    std::vector<double> v;
    for (const RunResult& r : runs) v.push_back(r.*field);
    return Summarize(v);
  }
  Spread OfInt(int64_t RunResult::*field) const {
    std::vector<double> v;
    for (const RunResult& r : runs) v.push_back(static_cast<double>(r.*field));
    return Summarize(v);
  }
  Spread OfInt32(int32_t RunResult::*field) const {
    std::vector<double> v;
    for (const RunResult& r : runs) v.push_back(r.*field);
    return Summarize(v);
  }
};

std::string CommandLine(const ServeFlags& f, int32_t ctx_size) {
  std::ostringstream s;
  s << "kvllm bench-serve -m " << f.model_path << " -t " << f.engine.threads << " -c " << ctx_size
    << " --clients " << f.clients << " --requests " << f.requests << " --system-tokens "
    << f.system_tokens << " --user-tokens " << f.user_tokens << " --max-tokens " << f.max_tokens
    << " --reserve-tokens " << f.reserve_tokens << " --mode " << f.mode << " -r "
    << f.repetitions << " --seed " << f.seed << " -ctk " << f.engine.cache_type_k << " -ctv "
    << f.engine.cache_type_v << " --block-size " << f.engine.block_size << " --max-num-seqs "
    << f.engine.max_num_seqs << " --max-num-batched-tokens " << f.engine.max_num_batched_tokens;
  if (f.engine.no_mmap) s << " --no-mmap";
  if (f.engine.no_repack) s << " --no-repack";
  return s.str();
}

Status Validate(const ServeFlags& f, const ModelConfig& c) {
  if (f.clients < 1) return Status::Error("--clients must be at least 1");
  if (f.requests < 1) return Status::Error("--requests must be at least 1");
  if (f.repetitions < 1) return Status::Error("-r/--repetitions must be at least 1");
  if (f.system_tokens < 0) return Status::Error("--system-tokens must not be negative");
  if (f.user_tokens < 1) {
    return Status::Error("--user-tokens must be at least 1 (it makes each request distinct)");
  }
  if (f.max_tokens < 1) return Status::Error("--max-tokens must be at least 1");
  if (c.n_vocab < 4) return Status::Error("the model's vocabulary is too small");
  if (f.engine.no_kv_cache || f.engine.kv_window > 0) {
    return Status::Error("bench-serve measures the paged KV cache: --no-kv-cache and "
                         "--kv-window are not supported");
  }
  if (f.engine.no_prefix_caching) {
    return Status::Error("bench-serve sets prefix caching per mode: use --mode paged instead "
                         "of --no-prefix-caching");
  }
  if (!f.engine.kv_store_dir.empty() || !f.engine.kv_store_redis.empty()) {
    // Every repetition after the first would read the shared prompt from the tier.
    return Status::Error("bench-serve measures one pool in memory: --kv-store-dir and "
                         "--kv-store-redis are not supported (bench/persistence.sh measures them)");
  }
  const int64_t need = int64_t{f.system_tokens} + f.user_tokens + f.max_tokens;
  if (need > c.n_ctx_train) {
    return Status::Error("--system-tokens + --user-tokens + --max-tokens = " +
                         std::to_string(need) + " do not fit the model's context of " +
                         std::to_string(c.n_ctx_train) + " tokens");
  }
  if (f.reserve_tokens < need) {
    return Status::Error("--reserve-tokens (" + std::to_string(f.reserve_tokens) +
                         ") must hold a whole request: --system-tokens + --user-tokens + "
                         "--max-tokens = " + std::to_string(need));
  }
  return Status::Ok();
}

// --mode: "all" or a comma-separated list of mode names, run in the order of kAllModes.
StatusOr<std::vector<Mode>> ParseModes(const std::string& text) {
  std::vector<Mode> modes;
  std::istringstream in(text);
  for (std::string name; std::getline(in, name, ',');) {
    bool known = false;
    for (Mode m : kAllModes) {
      if (name == "all" || name == ModeName(m)) {
        known = true;
        if (std::find(modes.begin(), modes.end(), m) == modes.end()) modes.push_back(m);
      }
    }
    if (!known) {
      return Status::Error("--mode takes all or a list of paged+prefix, paged, reserve (got '" +
                           name + "')");
    }
  }
  if (modes.empty()) return Status::Error("--mode names no mode");
  std::sort(modes.begin(), modes.end());
  return modes;
}

// The pool size in tokens: -c, else what --kv-mem holds, else room for eight whole contexts.
StatusOr<int32_t> PoolTokens(const EngineFlags& flags, const Model& model) {
  if (flags.ctx_size > 0) return flags.ctx_size;
  const int64_t eight_contexts = int64_t{8} * model.config().n_ctx_train;
  if (flags.kv_mem.empty()) return static_cast<int32_t>(std::min<int64_t>(eight_contexts, 1 << 30));
  EngineFlags probe = flags;
  probe.ctx_size = 1;
  KVLLM_ASSIGN_OR_RETURN(EngineOptions o, probe.ToOptions(model));
  KVLLM_ASSIGN_OR_RETURN(KVLayout layout,
                         KVLayout::Make(model.kv_shape(), o.block_size, o.k_type, o.v_type));
  KVLLM_ASSIGN_OR_RETURN(uint64_t budget, ParseBytes(flags.kv_mem));
  const uint64_t fit = budget / layout.bytes_per_block() * static_cast<uint64_t>(o.block_size);
  if (fit == 0) return Status::Error("--kv-mem " + flags.kv_mem + " holds no KV block");
  return static_cast<int32_t>(std::min<uint64_t>(fit, 1u << 30));
}

nlohmann::json SpreadJson(const Spread& s) {
  return nlohmann::json{{"median", s.median}, {"min", s.min}, {"max", s.max}};
}

int BenchServe(ServeFlags f) {
  auto fail = [](const std::string& msg) {
    std::fprintf(stderr, "kvllm bench-serve: %s\n", msg.c_str());
    return 1;
  };
  auto model = Model::Load(f.model_path, f.engine.load_options());
  if (!model.ok()) return fail(model.status().message());
  const ModelConfig& c = (*model)->config();
  if (f.reserve_tokens == 0) f.reserve_tokens = c.n_ctx_train;
  if (Status s = Validate(f, c); !s.ok()) return fail(s.message());
  auto parsed_modes = ParseModes(f.mode);
  if (!parsed_modes.ok()) return fail(parsed_modes.status().message());
  const std::vector<Mode> modes = *parsed_modes;
  if (f.engine.threads <= 0) {
    f.engine.threads = static_cast<int32_t>(std::thread::hardware_concurrency());
  }
  auto pool_tokens = PoolTokens(f.engine, **model);
  if (!pool_tokens.ok()) return fail(pool_tokens.status().message());
  EngineFlags pool_flags = f.engine;
  pool_flags.ctx_size = *pool_tokens;
  auto base = pool_flags.ToOptions(**model);
  if (!base.ok()) return fail(base.status().message());
  const int32_t pool_blocks = (*pool_tokens + base->block_size - 1) / base->block_size;
  const int32_t reserve_blocks = (f.reserve_tokens + base->block_size - 1) / base->block_size;
  if (reserve_blocks > pool_blocks) {
    return fail("the KV pool of " + WithCommas(*pool_tokens) +
                " tokens cannot reserve one whole context of --reserve-tokens " +
                std::to_string(f.reserve_tokens) + "; raise -c or --kv-mem");
  }
  auto layout = KVLayout::Make((*model)->kv_shape(), base->block_size, base->k_type, base->v_type);
  if (!layout.ok()) return fail(layout.status().message());
  const size_t pool_bytes = static_cast<size_t>(pool_blocks) * layout->bytes_per_block();

  auto options_of = [&](Mode m) {
    EngineOptions o = *base;
    o.prefix_caching = m == Mode::kPagedPrefix;
    o.scheduler.reserve_tokens = m == Mode::kReserve ? f.reserve_tokens : 0;
    return o;
  };
  const std::string cmd = CommandLine(f, *pool_tokens);
  std::fprintf(stderr, "bench-serve: %s\n", cmd.c_str());
  const Workload work = MakeWorkload(f, c.n_vocab);

  // Warm-up: touches the weights and the pool's threads once.
  {
    const int32_t n = std::min(f.clients, 4);
    Workload warm = work;
    warm.max_tokens = std::min(f.max_tokens, 4);
    auto r = RunWorkload(model->get(), options_of(modes.front()), warm, n,
                         std::min(n, f.requests), "warm-up");
    if (!r.ok()) return fail(r.status().message());
  }
  std::vector<ModeSummary> summaries;
  for (Mode m : modes) summaries.push_back({m, {}});
  for (int32_t rep = 0; rep < f.repetitions; ++rep) {
    for (ModeSummary& s : summaries) {
      const std::string label = std::string(ModeName(s.mode)) + " run " + std::to_string(rep + 1) +
                                "/" + std::to_string(f.repetitions);
      auto r = RunWorkload(model->get(), options_of(s.mode), work, f.clients, f.requests, label);
      if (!r.ok()) return fail(r.status().message());
      std::fprintf(stderr,
                   "bench-serve: %s: %.2f requests/s, %.1f tokens/s, %.1f in flight, "
                   "%d preemptions, %.2fs (%.2fs CPU)\n",
                   label.c_str(), r->requests_per_s, r->tokens_per_s, r->in_flight_mean,
                   static_cast<int>(r->preemptions), r->wall_s, r->cpu_s);
      s.runs.push_back(*r);
    }
  }

  const ModeSummary* best = nullptr;
  const ModeSummary* reserve = nullptr;
  for (const ModeSummary& s : summaries) {
    if (s.mode == Mode::kPagedPrefix) best = &s;
    if (s.mode == Mode::kReserve) reserve = &s;
  }
  const bool ratios = best != nullptr && reserve != nullptr;
  // Ratio of the medians, and the spread of the ratios of each repetition's adjacent runs.
  auto ratio = [&](double RunResult::*field) {
    const double den = reserve->Of(field).median;
    return den == 0 ? 0.0 : best->Of(field).median / den;
  };
  auto paired = [&](double RunResult::*field) {
    std::vector<double> v;
    for (size_t i = 0; i < best->runs.size(); ++i) {
      const double den = reserve->runs[i].*field;
      v.push_back(den == 0 ? 0.0 : best->runs[i].*field / den);
    }
    return Summarize(v);
  };

  if (f.json) {
    nlohmann::json j;
    j["command"] = cmd;
    j["model"] = f.model_path;
    j["threads"] = f.engine.threads;
    j["clients"] = f.clients;
    j["requests"] = f.requests;
    j["system_tokens"] = f.system_tokens;
    j["user_tokens"] = f.user_tokens;
    j["max_tokens"] = f.max_tokens;
    j["reserve_tokens"] = f.reserve_tokens;
    j["repetitions"] = f.repetitions;
    j["pool_tokens"] = int64_t{pool_blocks} * base->block_size;
    j["pool_blocks"] = pool_blocks;
    j["block_size"] = base->block_size;
    j["pool_bytes"] = pool_bytes;
    j["cache_type_k"] = f.engine.cache_type_k;
    j["cache_type_v"] = f.engine.cache_type_v;
    for (const ModeSummary& s : summaries) {
      nlohmann::json m;
      m["mode"] = ModeName(s.mode);
      m["requests_per_s"] = SpreadJson(s.Of(&RunResult::requests_per_s));
      m["tokens_per_s"] = SpreadJson(s.Of(&RunResult::tokens_per_s));
      m["requests_per_cpu_s"] = SpreadJson(s.Of(&RunResult::requests_per_cpu_s));
      m["ttft_p50_ms"] = SpreadJson(s.Of(&RunResult::ttft_p50_ms));
      m["ttft_p99_ms"] = SpreadJson(s.Of(&RunResult::ttft_p99_ms));
      m["in_flight_mean"] = SpreadJson(s.Of(&RunResult::in_flight_mean));
      m["in_flight_max"] = SpreadJson(s.OfInt32(&RunResult::in_flight_max));
      m["prefix_hit_rate"] = SpreadJson(s.Of(&RunResult::prefix_hit_rate));
      m["preemptions"] = SpreadJson(s.OfInt(&RunResult::preemptions));
      m["waste"] = SpreadJson(s.Of(&RunResult::waste));
      m["pool_use"] = SpreadJson(s.Of(&RunResult::pool_use));
      nlohmann::json runs = nlohmann::json::array();
      for (const RunResult& r : s.runs) {
        runs.push_back({{"wall_s", r.wall_s}, {"cpu_s", r.cpu_s}, {"completed", r.completed},
                        {"failed", r.failed},
                        {"generated_tokens", r.generated}, {"steps", r.steps},
                        {"requests_per_s", r.requests_per_s}, {"tokens_per_s", r.tokens_per_s},
                        {"prefix_hit_rate", r.prefix_hit_rate}, {"preemptions", r.preemptions},
                        {"in_flight_mean", r.in_flight_mean}, {"waste", r.waste}});
      }
      m["runs"] = runs;
      j["modes"].push_back(m);
    }
    if (ratios) {
      j["ratios"] = {{"requests_per_s", ratio(&RunResult::requests_per_s)},
                     {"tokens_per_s", ratio(&RunResult::tokens_per_s)},
                     {"in_flight_mean", ratio(&RunResult::in_flight_mean)},
                     {"requests_per_cpu_s", ratio(&RunResult::requests_per_cpu_s)},
                     {"requests_per_s_per_repetition",
                      SpreadJson(paired(&RunResult::requests_per_s))}};
    }
    std::cout << j.dump(2) << std::endl;
    return 0;
  }

  std::printf("command: %s\n", cmd.c_str());
  std::printf("model: %s (context %d); %d threads; KV pool %s tokens = %d blocks of %d = %s "
              "(%s/%s), the same for every mode\n",
              f.model_path.c_str(), c.n_ctx_train, f.engine.threads,
              WithCommas(static_cast<uint64_t>(pool_blocks) * base->block_size).c_str(),
              pool_blocks, base->block_size, FormatBytes(static_cast<double>(pool_bytes)).c_str(),
              f.engine.cache_type_k.c_str(), f.engine.cache_type_v.c_str());
  std::printf("workload: %d closed-loop clients, %d requests of %d shared system + %d own prompt "
              "tokens, %d generated (greedy, no stop); reserve mode reserves %d tokens per "
              "request\n\n",
              f.clients, f.requests, f.system_tokens, f.user_tokens, f.max_tokens,
              f.reserve_tokens);
  std::printf("median of %d runs per mode, run alternately:\n\n", f.repetitions);
  std::printf("| mode         | requests/s (min-max)     | req/CPU-s | gen tokens/s "
              "| TTFT p50 ms | TTFT p99 ms | in flight mean | max | prefix hit | preemptions "
              "| pool use | waste  |\n");
  std::printf("|--------------|-------------------------:|----------:|-------------:"
              "|------------:|------------:|---------------:|----:|-----------:|------------:"
              "|---------:|-------:|\n");
  for (const ModeSummary& s : summaries) {
    const Spread rps = s.Of(&RunResult::requests_per_s);
    char spread[64];
    // Three significant digits at least: a large model serves well under one request/s.
    const int digits = rps.min < 1 ? 3 : 2;
    std::snprintf(spread, sizeof(spread), "%.*f (%.*f-%.*f)", digits, rps.median, digits, rps.min,
                  digits, rps.max);
    std::printf("| %-12s | %24s | %9.*f | %12.1f | %11.1f | %11.1f | %14.1f | %3.0f | %9.1f%% "
                "| %11.0f | %7.1f%% | %5.1f%% |\n",
                ModeName(s.mode), spread, digits, s.Of(&RunResult::requests_per_cpu_s).median,
                s.Of(&RunResult::tokens_per_s).median,
                s.Of(&RunResult::ttft_p50_ms).median, s.Of(&RunResult::ttft_p99_ms).median,
                s.Of(&RunResult::in_flight_mean).median,
                s.OfInt32(&RunResult::in_flight_max).median,
                100 * s.Of(&RunResult::prefix_hit_rate).median,
                s.OfInt(&RunResult::preemptions).median, 100 * s.Of(&RunResult::pool_use).median,
                100 * s.Of(&RunResult::waste).median);
  }
  if (ratios) {
    const Spread per_rep = paired(&RunResult::requests_per_s);
    std::printf("\npaged+prefix / reserve at equal memory: %.2fx requests/s (per repetition "
                "%.2fx-%.2fx), %.2fx requests per CPU-second, %.2fx generated tokens/s, %.2fx "
                "requests in flight; paged+prefix waste %.1f%%\n",
                ratio(&RunResult::requests_per_s), per_rep.min, per_rep.max,
                ratio(&RunResult::requests_per_cpu_s), ratio(&RunResult::tokens_per_s),
                ratio(&RunResult::in_flight_mean),
                100 * best->Of(&RunResult::waste).median);
  }
  return 0;
}

}  // namespace

Command RegisterBenchServe(CLI::App* app) {
  auto f = std::make_shared<ServeFlags>();
  CLI::App* sub = app->add_subcommand(
      "bench-serve",
      "serve N clients with a shared system prompt: paged + prefix cache vs whole-context "
      "reservation at the same memory");
  sub->add_option("-m,--model", f->model_path, "GGUF model file")->required();
  sub->add_option("--clients", f->clients, "closed-loop clients (requests in the air at most)")
      ->capture_default_str();
  sub->add_option("--requests", f->requests, "requests served per run")->capture_default_str();
  sub->add_option("--system-tokens", f->system_tokens,
                  "tokens of the system prompt every request shares")
      ->capture_default_str();
  sub->add_option("--user-tokens", f->user_tokens, "tokens of each request's own part")
      ->capture_default_str();
  sub->add_option("--max-tokens", f->max_tokens, "tokens generated per request")
      ->capture_default_str();
  sub->add_option("--reserve-tokens", f->reserve_tokens,
                  "tokens the reserve mode sets aside per request (0: the model's context)")
      ->capture_default_str();
  sub->add_option("--mode", f->mode,
                  "all, or a comma-separated list of paged+prefix, paged, reserve")
      ->capture_default_str();
  sub->add_option("-r,--repetitions", f->repetitions, "runs per mode (median reported)")
      ->capture_default_str();
  sub->add_option("--seed", f->seed, "seed of the random prompts")->capture_default_str();
  sub->add_flag("--json", f->json, "print JSON");
  f->engine.Register(sub);
  sub->get_option("--ctx-size")
      ->description("KV pool size in tokens, the same for every mode (default: eight model "
                    "contexts, or what --kv-mem holds)");
  return [f] { return BenchServe(*f); };
}

}  // namespace kvllm::cli
