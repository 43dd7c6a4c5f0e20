// `kvllm bench`: llama-bench-style throughput rows (pp = prompt processing, tg = text
// generation) and the cost of one decode step at growing context depth with and without the
// KV cache. Every figure is the median of several runs after a warm-up, printed with min/max
// and the command that produced it. Unless --no-roofline, each row also gets the roofline
// limit of the machine it runs on (bench_roofline.h) and the fraction of it reached.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <iostream>
#include <memory>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include <nlohmann/json.hpp>

#include "cli/bench_roofline.h"
#include "cli/commands.h"
#include "cli/common.h"
#include "kv/kv_layout.h"
#include "tensor/kernels.h"
#include "tensor/roofline.h"
#include "tensor/thread_pool.h"

namespace kvllm::cli {
namespace {

struct BenchFlags {
  std::string model_path;
  int32_t n_prompt = 512;
  int32_t n_gen = 128;
  int32_t repetitions = 3;
  std::vector<int32_t> depths = {64, 128, 256, 512, 1024};
  int32_t depth_steps = 3;
  bool cache_only = false;  // skip the no-cache column of the depth table
  bool json = false;
  bool roofline = true;          // measure bandwidth and FMA peak; print the limit columns
  int64_t roofline_buffer_mib = 0;  // 0 = max(1 GiB, 8 x L3)
  EngineFlags engine;
};

std::vector<int32_t> RandomPrompt(int32_t n, int32_t n_vocab, uint32_t seed) {
  std::mt19937 rng(seed);
  // Ids 0..2 are unk/bos/eos in Llama vocabularies; ordinary tokens make an honest load.
  std::uniform_int_distribution<int32_t> dist(std::min(3, n_vocab - 1), n_vocab - 1);
  std::vector<int32_t> p(n);
  for (int32_t& t : p) t = dist(rng);
  return p;
}

// Queues a request for n_gen tokens after `prompt`; its sequence's id.
SeqId AddGreedy(Engine& engine, std::vector<int32_t> prompt, int32_t n_gen) {
  Request req;
  req.prompt = std::move(prompt);
  req.params.max_tokens = n_gen;
  req.params.sampling.temperature = 0;  // greedy: no sampling cost worth measuring
  return engine.Add(std::move(req)).value();
}

// Runs one request to completion and returns its timings.
SequenceTimings RunOnce(Engine& engine, std::vector<int32_t> prompt, int32_t n_gen) {
  const SeqId id = AddGreedy(engine, std::move(prompt), n_gen);
  std::vector<TokenEvent> events;
  while (engine.HasUnfinished()) {
    events.clear();
    engine.Step(&events);
  }
  SequenceTimings t = engine.Get(id).timings;
  engine.Release(id);
  return t;
}

// One request to completion, timing each step that samples a token (a prompt too long for
// one step takes several before its first), with the read bandwidth probed just before each
// step when `probe` is given (0 otherwise).
struct TimedStep {
  double seconds = 0;
  double bandwidth = 0;
  double started = 0;  // BenchClock() when the step began
};

// Seconds since the bench began (its first call).
double BenchClock() {
  static const auto start = std::chrono::steady_clock::now();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}
std::vector<TimedStep> RunTimed(Engine& engine, std::vector<int32_t> prompt, int32_t n_gen,
                                ReadProbe* probe) {
  const SeqId id = AddGreedy(engine, std::move(prompt), n_gen);
  std::vector<TokenEvent> events;
  std::vector<TimedStep> steps;
  while (engine.HasUnfinished()) {
    events.clear();
    TimedStep step;
    if (probe != nullptr) step.bandwidth = probe->Pass();
    step.started = BenchClock();
    engine.Step(&events);
    step.seconds = BenchClock() - step.started;
    if (!events.empty()) steps.push_back(step);
  }
  engine.Release(id);
  return steps;
}

// One request per engine, decoded side by side: each prompt is prefilled first (untimed, up to
// the step that samples its first token), then the engines take a step each in turn, each
// step after its own probe pass when `probe` is given, until every request has n_gen tokens.
// Each engine's timed steps (n_gen - 1 of them).
std::vector<std::vector<TimedStep>> RunSideBySide(const std::vector<Engine*>& engines,
                                                  const std::vector<std::vector<int32_t>>& prompts,
                                                  int32_t n_gen, ReadProbe* probe) {
  std::vector<SeqId> ids;
  std::vector<TokenEvent> events;
  for (size_t e = 0; e < engines.size(); ++e) {
    ids.push_back(AddGreedy(*engines[e], prompts[e], n_gen));
    do {
      events.clear();
      engines[e]->Step(&events);
    } while (events.empty() && engines[e]->HasUnfinished());
  }
  std::vector<std::vector<TimedStep>> steps(engines.size());
  for (bool busy = true; busy;) {
    busy = false;
    for (size_t e = 0; e < engines.size(); ++e) {
      if (!engines[e]->HasUnfinished()) continue;
      busy = true;
      events.clear();
      TimedStep step;
      if (probe != nullptr) step.bandwidth = probe->Pass();
      step.started = BenchClock();
      engines[e]->Step(&events);
      step.seconds = BenchClock() - step.started;
      if (!events.empty()) steps[e].push_back(step);
    }
  }
  for (size_t e = 0; e < engines.size(); ++e) engines[e]->Release(ids[e]);
  return steps;
}

std::string CommandLine(const BenchFlags& f) {
  std::ostringstream s;
  s << "kvllm bench -m " << f.model_path << " -t " << f.engine.threads << " -p " << f.n_prompt
    << " -n " << f.n_gen << " -r " << f.repetitions << " --depth-steps " << f.depth_steps
    << " -ctk " << f.engine.cache_type_k << " -ctv " << f.engine.cache_type_v
    << " --block-size " << f.engine.block_size;
  if (f.depths.empty()) s << " --no-depths";
  if (f.cache_only) s << " --cache-only";
  if (f.engine.no_mmap) s << " --no-mmap";
  if (f.engine.no_repack) s << " --no-repack";
  if (!f.roofline) s << " --no-roofline";
  if (f.roofline && f.roofline_buffer_mib > 0) {
    s << " --roofline-buffer-mib " << f.roofline_buffer_mib;
  }
  for (size_t i = 0; i < f.depths.size(); ++i) s << (i ? "," : " --depths ") << f.depths[i];
  return s.str();
}

int Bench(BenchFlags f) {
  auto model = Model::Load(f.model_path, f.engine.load_options());
  if (!model.ok()) {
    std::fprintf(stderr, "kvllm bench: %s\n", model.status().message().c_str());
    return 1;
  }
  const ModelConfig& c = (*model)->config();
  if (f.repetitions < 1 || f.n_prompt < 1 || f.n_gen < 1 || f.depth_steps < 1) {
    std::fprintf(stderr, "kvllm bench: -p, -n, -r and --depth-steps must be positive\n");
    return 1;
  }
  if (f.engine.threads <= 0) f.engine.threads = static_cast<int32_t>(std::thread::hardware_concurrency());
  int32_t max_depth = 0;
  for (int32_t d : f.depths) max_depth = std::max(max_depth, d);
  if (f.engine.ctx_size == 0) {
    f.engine.ctx_size = std::max({f.n_prompt + 1, f.n_gen + 1, max_depth + f.depth_steps + 2});
  }
  EngineFlags nocache_flags = f.engine;
  nocache_flags.no_kv_cache = true;
  f.engine.no_kv_cache = false;
  auto opts = f.engine.ToOptions(**model);
  auto nocache_opts = nocache_flags.ToOptions(**model);
  if (!opts.ok() || !nocache_opts.ok()) {
    std::fprintf(stderr, "kvllm bench: %s\n",
                 (opts.ok() ? nocache_opts.status() : opts.status()).message().c_str());
    return 1;
  }
  // Every row measures computation: a prompt found in the prefix cache would not be computed
  // (the depth table's prompts share prefixes). Prefix reuse is measured by bench-serve.
  opts->prefix_caching = false;
  // The warm-up, pp and tg run here (a 64-token prompt and 4 tokens at most for the first);
  // each depth in an engine of its own (below).
  EngineOptions tg_opts = *opts;
  tg_opts.ctx_size = std::min(tg_opts.ctx_size, std::max({f.n_prompt, f.n_gen, 64}) + 4);
  auto cached = Engine::Create(model->get(), tg_opts);
  auto nocache = Engine::Create(model->get(), *nocache_opts);
  if (!cached.ok() || !nocache.ok()) {
    std::fprintf(stderr, "kvllm bench: %s\n",
                 (cached.ok() ? nocache.status() : cached.status()).message().c_str());
    return 1;
  }
  BenchClock();
  const std::string cmd = CommandLine(f);
  std::fprintf(stderr, "bench: %s\n", cmd.c_str());

  // The ceilings, measured with the bench's thread count before the rows (the pool is gone
  // before the engines run).
  std::optional<Roofline> roof;
  if (f.roofline) {
    std::fprintf(stderr, "bench: measuring read bandwidth and the FMA and 8-bit dot peaks\n");
    ThreadPool pool(f.engine.threads);
    RooflineOptions ro;
    ro.buffer_bytes = f.roofline_buffer_mib * (int64_t{1} << 20);
    roof = MeasureRoofline(pool, ro);
  }
  auto layout = KVLayout::Make((*model)->kv_shape(), opts->block_size, opts->k_type, opts->v_type);
  if (!layout.ok()) {
    std::fprintf(stderr, "kvllm bench: %s\n", layout.status().message().c_str());
    return 1;
  }
  const TokenCosts costs = ComputeTokenCosts(**model, *layout, opts->kv_window, opts->kv_sinks);
  // Context attended over, on average, by the timed decode steps: tg's step i (i < n_gen)
  // attends over i + 1 tokens; a depth row's step j (1..depth_steps) over depth + j.
  const double tg_context = (f.n_gen + 1) / 2.0;
  auto depth_context = [&f](int32_t depth) { return depth + (f.depth_steps + 1) / 2.0; };
  const double pp_flops = costs.PrefillFlopsPerToken(f.n_prompt);
  const double tg_bytes = costs.DecodeBytes(tg_context);
  // Limit tokens/s of the pp row (0 without a roofline).
  const double pp_limit =
      roof ? 1 / costs.PrefillSecondsPerToken(f.n_prompt, roof->fma_flops_per_s,
                                              roof->int8_ops_per_s)
           : 0;
  // The read bandwidth of a shared machine changes between fast and slow spells of a fraction
  // of a second (other tenants' memory traffic), and a decode step is bound by the bandwidth
  // of its own spell: before every step of a tg or depth run, one pass of the read loop over
  // 256 MiB (past the L3 a core reaches on current CPUs; 5-10 ms here), or the roofline's
  // buffer if smaller, with the engine's thread count, and each step is judged against it. A
  // best-of figure taken once before a run (as the roofline's) finds a fast spell more often
  // than the run's steps do.
  std::unique_ptr<ThreadPool> probe_pool;
  std::unique_ptr<ReadProbe> probe;
  if (roof) {
    probe_pool = std::make_unique<ThreadPool>(f.engine.threads);
    probe = std::make_unique<ReadProbe>(*probe_pool,
                                        std::min(int64_t{256} << 20, roof->buffer_bytes));
  }

  // Warm-up: touches the weights and the pool's threads once.
  RunOnce(**cached, RandomPrompt(std::min(f.n_prompt, 64), c.n_vocab, 0), 4);

  // Per decode run: its bandwidth (the probes' bytes over their seconds: the harmonic mean of
  // their rates), limit and fraction of it. The limit of a step attending over `context` tokens: its bytes at the bandwidth probed
  // just before it, plus attention's arithmetic where that outlasts the cache's bytes
  // (TokenCosts::DecodeSeconds); a run's limit time is the sum over its steps, its fraction
  // that sum over the steps' seconds.
  struct Judged {
    std::vector<double> bandwidth, limit, fraction;
    std::vector<std::vector<TimedStep>> runs;  // each run's timed steps, for --json
  };
  // steps[first..] are the timed ones; step first + i attends over context0 + i tokens.
  auto judge = [&](Judged& j, const std::vector<TimedStep>& steps, size_t first,
                   double context0) {
    double seconds = 0, limit_seconds = 0, inverse_bandwidth = 0;
    for (size_t i = first; i < steps.size(); ++i) {
      const double bw = steps[i].bandwidth;
      seconds += steps[i].seconds;
      limit_seconds += costs.DecodeSeconds(context0 + static_cast<double>(i - first), bw,
                                           roof->fma_flops_per_s, roof->int8_ops_per_s);
      inverse_bandwidth += 1 / bw;
    }
    const double n = static_cast<double>(steps.size() - first);
    j.bandwidth.push_back(n / inverse_bandwidth);
    j.limit.push_back(n / limit_seconds);
    j.fraction.push_back(limit_seconds / seconds);
    j.runs.emplace_back(steps.begin() + static_cast<std::ptrdiff_t>(first), steps.end());
  };
  auto step_seconds = [](const std::vector<TimedStep>& steps, size_t first) {
    double s = 0;
    for (size_t i = first; i < steps.size(); ++i) s += steps[i].seconds;
    return s;
  };
  std::vector<double> pp, tg;
  Judged tg_judged;
  for (int32_t r = 0; r < f.repetitions; ++r) {
    std::fprintf(stderr, "bench: pp%d run %d/%d\n", f.n_prompt, r + 1, f.repetitions);
    SequenceTimings t = RunOnce(**cached, RandomPrompt(f.n_prompt, c.n_vocab, 1 + r), 1);
    pp.push_back(f.n_prompt * 1000.0 / t.prefill_ms);
    std::fprintf(stderr, "bench: tg%d run %d/%d\n", f.n_gen, r + 1, f.repetitions);
    // Each step samples one token: the first prefills the one-token prompt, as a decode step.
    const std::vector<TimedStep> steps =
        RunTimed(**cached, RandomPrompt(1, c.n_vocab, 100 + r), f.n_gen, probe.get());
    tg.push_back(static_cast<double>(steps.size()) / step_seconds(steps, 0));
    if (roof) judge(tg_judged, steps, 0, 1);
  }
  const Spread pps = Summarize(pp), tgs = Summarize(tg);
  const double tg_limit = roof ? Summarize(tg_judged.limit).median : 0;
  const double tg_fraction = roof ? Summarize(tg_judged.fraction).median : 0;

  struct DepthRow {
    int32_t depth;
    Spread cached, nocache;
    double bandwidth = 0, limit = 0, fraction = 0;  // medians over the runs
    // Median over the repetitions of this depth's tokens/s / the first depth's in the same
    // repetition (1 for the first depth itself).
    double vs_first = 1;
  };
  // Each depth decodes in an engine of its own (its pool sized for that depth), and each
  // repetition steps all of them side by side, deepest first, a step of each in turn: the
  // slowdown at depth is a ratio of steps milliseconds apart, each judged against its own
  // probe, not of runs seconds apart on a machine whose bandwidth changes between spells of
  // a fraction of a second.
  std::vector<int32_t> order(f.depths.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int32_t>(i);
  std::stable_sort(order.begin(), order.end(),
                   [&f](int32_t a, int32_t b) { return f.depths[a] > f.depths[b]; });
  const size_t n_depths = f.depths.size();
  std::vector<std::unique_ptr<Engine>> depth_engines;
  for (int32_t i : order) {
    EngineOptions o = *opts;
    o.ctx_size = std::min(o.ctx_size, f.depths[i] + f.depth_steps + 2);
    auto engine = Engine::Create(model->get(), o);
    if (!engine.ok()) {
      std::fprintf(stderr, "kvllm bench: %s\n", engine.status().message().c_str());
      return 1;
    }
    depth_engines.push_back(std::move(*engine));
  }
  std::vector<Engine*> engines;
  for (const auto& e : depth_engines) engines.push_back(e.get());
  std::vector<std::vector<double>> with(n_depths), without(n_depths);
  std::vector<Judged> judged(n_depths);
  for (int32_t r = 0; r < f.repetitions; ++r) {
    std::fprintf(stderr, "bench: depths side by side, run %d/%d\n", r + 1, f.repetitions);
    std::vector<std::vector<int32_t>> prompts;
    for (int32_t i : order) prompts.push_back(RandomPrompt(f.depths[i], c.n_vocab, 200 + r));
    const std::vector<std::vector<TimedStep>> runs =
        RunSideBySide(engines, prompts, 1 + f.depth_steps, probe.get());
    for (size_t k = 0; k < order.size(); ++k) {
      const int32_t i = order[k];
      const std::vector<TimedStep>& steps = runs[k];
      with[i].push_back(1000.0 * step_seconds(steps, 0) / static_cast<double>(steps.size()));
      if (roof) judge(judged[i], steps, 0, f.depths[i] + 1.0);
    }
    if (f.cache_only) continue;
    for (int32_t i : order) {
      const int32_t d = f.depths[i];
      std::fprintf(stderr, "bench: depth %d without the cache, run %d/%d\n", d, r + 1,
                   f.repetitions);
      const SequenceTimings t =
          RunOnce(**nocache, RandomPrompt(d, c.n_vocab, 200 + r), 1 + f.depth_steps);
      without[i].push_back(t.decode_ms / t.decode_steps);
    }
  }
  std::vector<DepthRow> depth_rows;
  for (size_t i = 0; i < n_depths; ++i) {
    DepthRow row{f.depths[i], Summarize(with[i]), f.cache_only ? Spread{} : Summarize(without[i])};
    if (roof) {
      row.bandwidth = Summarize(judged[i].bandwidth).median;
      row.limit = Summarize(judged[i].limit).median;
      row.fraction = Summarize(judged[i].fraction).median;
    }
    std::vector<double> ratios;
    for (int32_t r = 0; r < f.repetitions; ++r) ratios.push_back(with[0][r] / with[i][r]);
    row.vs_first = Summarize(ratios).median;
    depth_rows.push_back(row);
  }

  const Weights& w = (*model)->weights();
  const double weight_bytes = static_cast<double>(w.DecodeBytes());
  const double params = static_cast<double>(c.ParamCount(w.tied_output));
  const char* wtype = DTypeName(w.layers.empty() ? w.output.type : w.layers[0].wq.type);
  if (f.json) {
    nlohmann::json j;
    j["command"] = cmd;
    j["model"] = f.model_path;
    j["weight_type"] = wtype;
    j["params"] = params;
    j["threads"] = f.engine.threads;
    j["simd"] = SimdLevelName(Kernels().level);
    j["mmap"] = !f.engine.no_mmap;
    j["repack"] = !f.engine.no_repack;
    j["weight_bytes_per_token"] = costs.weight_bytes;  // read by every decode step
    j["kv_bytes_per_token"] = costs.kv_bytes_per_token;  // per cached token attended over
    j["attention_flops_per_token"] = costs.attention_flops_per_pair;  // likewise
    j["attention_int8_share"] = costs.attention_int8_share;
    j["attention_int16_share"] = costs.attention_int16_share;
    if (roof) {
      j["roofline"] = {{"read_bytes_per_s", roof->read_bytes_per_s},
                       {"fma_flops_per_s", roof->fma_flops_per_s},
                       {"int8_ops_per_s", roof->int8_ops_per_s},
                       {"matmul_f32_flops_per_s", roof->matmul_flops_per_s},
                       {"buffer_bytes", roof->buffer_bytes},
                       {"threads", roof->threads},
                       {"simd", SimdLevelName(roof->level)}};
    }
    // Each run's steps: the seconds of each, the read bandwidth probed just before it and when
    // it began (seconds since the bench began).
    auto runs_json = [](const Judged& judged) {
      nlohmann::json runs = nlohmann::json::array();
      for (const std::vector<TimedStep>& steps : judged.runs) {
        nlohmann::json seconds = nlohmann::json::array(), bandwidth = nlohmann::json::array(),
                       started = nlohmann::json::array();
        for (const TimedStep& step : steps) {
          seconds.push_back(step.seconds);
          bandwidth.push_back(step.bandwidth);
          started.push_back(step.started);
        }
        runs.push_back({{"step_seconds", seconds}, {"step_read_bytes_per_s", bandwidth},
                        {"step_started_s", started}});
      }
      return runs;
    };
    auto row = [&roof](const std::string& test, const Spread& s, double limit, double fraction) {
      nlohmann::json r{{"test", test}, {"tokens_per_s", s.median}, {"min", s.min}, {"max", s.max}};
      if (roof) {
        r["limit_tokens_per_s"] = limit;
        r["fraction_of_limit"] = fraction;
      }
      return r;
    };
    nlohmann::json pp_row =
        row("pp" + std::to_string(f.n_prompt), pps, pp_limit, pps.median / pp_limit);
    pp_row["flops_per_token"] = pp_flops;
    pp_row["int8_ops_per_token"] = costs.PrefillInt8OpsPerToken(f.n_prompt);
    nlohmann::json tg_row = row("tg" + std::to_string(f.n_gen), tgs, tg_limit, tg_fraction);
    tg_row["bytes_per_token"] = tg_bytes;
    // Medians over the runs of each run's bandwidth, limit and fraction (judge).
    if (roof) {
      tg_row["read_bytes_per_s"] = Summarize(tg_judged.bandwidth).median;
      tg_row["runs"] = runs_json(tg_judged);
    }
    j["rows"] = {pp_row, tg_row};
    for (size_t i = 0; i < depth_rows.size(); ++i) {
      const DepthRow& r = depth_rows[i];
      nlohmann::json row{{"depth", r.depth}, {"cached_ms_per_token", r.cached.median},
                         {"cached_tokens_per_s", 1000.0 / r.cached.median},
                         {"cached_vs_first_depth", r.vs_first},
                         {"bytes_per_token", costs.DecodeBytes(depth_context(r.depth))}};
      if (roof) {
        row["read_bytes_per_s"] = r.bandwidth;
        row["cached_limit_tokens_per_s"] = r.limit;
        row["cached_fraction_of_limit"] = r.fraction;
        row["runs"] = runs_json(judged[i]);
      }
      if (!f.cache_only) {
        row["nocache_ms_per_token"] = r.nocache.median;
        row["ratio"] = r.nocache.median / r.cached.median;
      }
      j["depth"].push_back(row);
    }
    std::cout << j.dump(2) << std::endl;
    return 0;
  }
  std::printf("command: %s\n", cmd.c_str());
  std::printf("model: %s, %s weights, %.2fM params, %s read per decode step; %d threads, %s "
              "kernels; KV %s/%s, block %d\n\n",
              f.model_path.c_str(), wtype, params / 1e6, FormatBytes(weight_bytes).c_str(),
              f.engine.threads, SimdLevelName(Kernels().level), f.engine.cache_type_k.c_str(),
              f.engine.cache_type_v.c_str(), f.engine.block_size);
  if (roof) {
    std::printf("roofline (%d threads, %s): read bandwidth %.2f GB/s (best of %d passes over %s); "
                "FMA peak %.1f GFLOP/s and 8-bit dot peak %.1f GOP/s (register-only loops); "
                "kvllm f32 matmul %.1f GFLOP/s (L2-resident)\n",
                roof->threads, SimdLevelName(roof->level), roof->read_bytes_per_s / 1e9,
                RooflineOptions{}.passes,
                FormatBytes(static_cast<double>(roof->buffer_bytes)).c_str(),
                roof->fma_flops_per_s / 1e9, roof->int8_ops_per_s / 1e9,
                roof->matmul_flops_per_s / 1e9);
    std::printf("limits: decode = 1 / (%s of weights / bandwidth + max(%s of KV per cached "
                "token x context / bandwidth, %.2f MFLOP of attention per cached token x "
                "context at the peaks%s%s)), each decode step at the bandwidth of one pass of "
                "the read loop over %s just before it, a run's limit the sum over its steps, "
                "median over the runs (as the %% of limit); prefill = 1 / (float FLOPs per prompt "
                "token / FMA peak + 8-bit ops of Q8_0/Q4_0 matrices / 8-bit dot peak)\n\n",
                FormatBytes(costs.weight_bytes).c_str(),
                FormatBytes(costs.kv_bytes_per_token).c_str(),
                costs.attention_flops_per_pair / 1e6,
                costs.attention_int8_share > 0 ? ", q.k as 8-bit ops" : "",
                costs.attention_int16_share > 0 ? ", v's weighted sum as 16-bit ops" : "",
                FormatBytes(static_cast<double>(probe->bytes())).c_str());
    std::printf("| test   | tokens/s (median of %d) |      min |      max | limit tokens/s | "
                "%% of limit |\n", f.repetitions);
    std::printf("|--------|------------------------:|---------:|---------:|---------------:|"
                "-----------:|\n");
    std::printf("| pp%-4d | %23.2f | %8.2f | %8.2f | %14.2f | %9.1f%% |\n", f.n_prompt,
                pps.median, pps.min, pps.max, pp_limit, 100 * pps.median / pp_limit);
    std::printf("| tg%-4d | %23.2f | %8.2f | %8.2f | %14.2f | %9.1f%% |\n\n", f.n_gen,
                tgs.median, tgs.min, tgs.max, tg_limit, 100 * tg_fraction);
  } else {
    std::printf("| test   | tokens/s (median of %d) |      min |      max |\n", f.repetitions);
    std::printf("|--------|------------------------:|---------:|---------:|\n");
    std::printf("| pp%-4d | %23.2f | %8.2f | %8.2f |\n", f.n_prompt, pps.median, pps.min, pps.max);
    std::printf("| tg%-4d | %23.2f | %8.2f | %8.2f |\n\n", f.n_gen, tgs.median, tgs.min, tgs.max);
  }
  if (depth_rows.empty()) return 0;
  std::printf("decode time per token at context depth (median of %d runs of %d steps; each "
              "run steps every depth side by side, a step of each in turn; vs depth %d: median "
              "of the runs' tokens/s ratios):\n",
              f.repetitions, f.depth_steps, f.depths[0]);
  // The KV cache columns, then (unless --cache-only) the no-cache baseline.
  const std::string vs = "vs depth " + std::to_string(f.depths[0]);
  std::string head = "| depth | KV cache ms/token | tokens/s | " + vs + " |";
  std::string rule = "|------:|------------------:|---------:|" + std::string(vs.size() + 1, '-') +
                     ":|";
  if (roof) {
    head += " limit tokens/s | % of limit |";
    rule += "---------------:|-----------:|";
  }
  if (!f.cache_only) {
    head += " no cache ms/token | no cache / cache |";
    rule += "------------------:|-----------------:|";
  }
  std::printf("%s\n%s\n", head.c_str(), rule.c_str());
  for (const DepthRow& r : depth_rows) {
    const double tps = 1000.0 / r.cached.median;
    std::printf("| %5d | %17.3f | %8.2f | %+*.1f%% |", r.depth, r.cached.median, tps,
                static_cast<int>(vs.size()) - 1, 100 * (r.vs_first - 1));
    if (roof) {
      std::printf(" %14.2f | %9.1f%% |", r.limit, 100 * r.fraction);
    }
    if (!f.cache_only) {
      std::printf(" %17.3f | %15.1fx |", r.nocache.median, r.nocache.median / r.cached.median);
    }
    std::printf("\n");
  }
  return 0;
}

}  // namespace

Command RegisterBench(CLI::App* app) {
  auto f = std::make_shared<BenchFlags>();
  CLI::App* sub = app->add_subcommand("bench", "measure prefill and decode speed, with and without the KV cache");
  sub->add_option("-m,--model", f->model_path, "GGUF model file")->required();
  sub->add_option("-p,--n-prompt", f->n_prompt, "prompt tokens of the pp test")->capture_default_str();
  sub->add_option("-n,--n-gen", f->n_gen, "generated tokens of the tg test")->capture_default_str();
  sub->add_option("-r,--repetitions", f->repetitions, "runs per figure (median reported)")
      ->capture_default_str();
  auto* depths =
      sub->add_option("--depths", f->depths, "context depths of the decode table")->delimiter(',');
  sub->add_flag_callback("--no-depths", [f] { f->depths.clear(); },
                         "skip the decode-by-depth table (slow for large models without cache)")
      ->excludes(depths);
  sub->add_option("--depth-steps", f->depth_steps, "decode steps timed per depth and run")
      ->capture_default_str();
  sub->add_flag("--cache-only", f->cache_only, "depth table with the KV cache only (no baseline)");
  sub->add_flag("--json", f->json, "print JSON");
  sub->add_flag_callback("--no-roofline", [f] { f->roofline = false; },
                         "skip measuring bandwidth and FMA peak (no limit columns)");
  sub->add_option("--roofline-buffer-mib", f->roofline_buffer_mib,
                  "buffer streamed to measure read bandwidth (0 = max(1 GiB, 8 x L3))")
      ->capture_default_str();
  f->engine.Register(sub);
  return [f] { return Bench(*f); };
}

}  // namespace kvllm::cli
