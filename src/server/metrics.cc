#include "server/metrics.h"

#include <algorithm>
#include <cstdio>

namespace kvllm::server {
namespace {

std::string Num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

void Line(std::string* out, const std::string& name, const std::string& type,
          const std::string& help) {
  *out += "# HELP " + name + " " + help + "\n# TYPE " + name + " " + type + "\n";
}

void Gauge(std::string* out, const std::string& name, const std::string& help, double v) {
  Line(out, name, "gauge", help);
  *out += name + " " + Num(v) + "\n";
}

void Counter(std::string* out, const std::string& name, const std::string& help, double v) {
  Line(out, name, "counter", help);
  *out += name + " " + Num(v) + "\n";
}

// Latency buckets in seconds, as vLLM's TTFT histogram spans them.
std::vector<double> LatencyBuckets() {
  return {0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0,
          2.5,   5.0,   7.5,  10.0, 20.0, 40.0, 80.0, 160.0, 640.0};
}

}  // namespace

Histogram::Histogram(std::vector<double> upper_bounds)
    : bounds_(std::move(upper_bounds)), counts_(bounds_.size() + 1, 0) {}

void Histogram::Observe(double v) {
  const size_t i = std::lower_bound(bounds_.begin(), bounds_.end(), v) - bounds_.begin();
  ++counts_[i];
  sum_ += v;
  ++count_;
}

void Histogram::Render(const std::string& name, const std::string& help, std::string* out) const {
  Line(out, name, "histogram", help);
  uint64_t cumulative = 0;
  for (size_t i = 0; i < bounds_.size(); ++i) {
    cumulative += counts_[i];
    *out += name + "_bucket{le=\"" + Num(bounds_[i]) + "\"} " + std::to_string(cumulative) + "\n";
  }
  *out += name + "_bucket{le=\"+Inf\"} " + std::to_string(count_) + "\n";
  *out += name + "_sum " + Num(sum_) + "\n";
  *out += name + "_count " + std::to_string(count_) + "\n";
}

Metrics::Metrics()
    : ttft_(LatencyBuckets()), itl_(LatencyBuckets()), e2e_(LatencyBuckets()),
      queue_(LatencyBuckets()) {}

void Metrics::RecordPromptTokens(int64_t n) {
  std::lock_guard lock(mu_);
  prompt_tokens_ += n;
}
void Metrics::RecordGenerationTokens(int64_t n) {
  std::lock_guard lock(mu_);
  generation_tokens_ += n;
}
void Metrics::RecordFinished(const std::string& reason) {
  std::lock_guard lock(mu_);
  ++finished_[reason];
}
void Metrics::RecordRejected(int status) {
  std::lock_guard lock(mu_);
  ++rejected_[status];
}
void Metrics::RecordTtft(double s) {
  std::lock_guard lock(mu_);
  ttft_.Observe(s);
}
void Metrics::RecordInterToken(double s) {
  std::lock_guard lock(mu_);
  itl_.Observe(s);
}
void Metrics::RecordE2e(double s) {
  std::lock_guard lock(mu_);
  e2e_.Observe(s);
}
void Metrics::RecordQueueTime(double s) {
  std::lock_guard lock(mu_);
  queue_.Observe(s);
}

std::string Metrics::Render(const GaugeSnapshot& g) const {
  std::lock_guard lock(mu_);
  std::string out;
  Gauge(&out, "kvllm:num_requests_running", "Sequences in the running batch.", g.running);
  Gauge(&out, "kvllm:num_requests_waiting", "Sequences waiting to be scheduled.", g.waiting);
  Gauge(&out, "kvllm:kv_cache_usage_perc",
        "Fraction of KV blocks held by sequences (1 = full; cached-free blocks not counted).",
        g.kv_usage);
  Gauge(&out, "kvllm:kv_cache_blocks_total", "KV blocks in the pool.", g.blocks_total);
  Gauge(&out, "kvllm:kv_cache_blocks_used", "KV blocks held by sequences.", g.blocks_used);
  Gauge(&out, "kvllm:kv_cache_blocks_cached_free",
        "KV blocks held only by the prefix cache (reusable, evicted when memory is needed).",
        g.blocks_cached_free);
  Counter(&out, "kvllm:prefix_cache_queries_total", "Prompt tokens looked up in the prefix cache.",
          static_cast<double>(g.prefix_queries));
  Counter(&out, "kvllm:prefix_cache_hits_total", "Prompt tokens found in the prefix cache.",
          static_cast<double>(g.prefix_hits));
  Counter(&out, "kvllm:prefix_cache_evictions_total", "Cached KV blocks evicted for memory.",
          static_cast<double>(g.evictions));
  struct TierCounter {
    const char* name;
    const char* help;
    int64_t TierStats::*value;
  };
  static constexpr TierCounter kTierCounters[] = {
      {"kvllm:kv_store_hits_total", "KV blocks read from a persistent tier instead of computed.",
       &TierStats::hits},
      {"kvllm:kv_store_misses_total", "KV blocks a persistent tier did not have.",
       &TierStats::misses},
      {"kvllm:kv_store_errors_total", "Failed persistent tier operations (treated as misses).",
       &TierStats::errors},
      {"kvllm:kv_store_rejected_total", "Stored KV blocks that failed a check and were removed.",
       &TierStats::rejected},
      {"kvllm:kv_store_writes_total", "KV blocks written to a persistent tier.",
       &TierStats::writes}};
  for (const TierCounter& c : kTierCounters) {
    if (g.tiers.empty()) break;
    Line(&out, c.name, "counter", c.help);
    for (const TierStats& t : g.tiers) {
      out += std::string(c.name) + "{tier=\"" + t.name + "\"} " +
             Num(static_cast<double>(t.*c.value)) + "\n";
    }
  }
  Counter(&out, "kvllm:num_preemptions_total", "Sequences preempted for lack of KV blocks.",
          static_cast<double>(g.preemptions));
  Counter(&out, "kvllm:prompt_tokens_total", "Prompt tokens of accepted requests.",
          static_cast<double>(prompt_tokens_));
  Counter(&out, "kvllm:generation_tokens_total", "Generated tokens.",
          static_cast<double>(generation_tokens_));
  Line(&out, "kvllm:request_success_total", "counter", "Finished requests by finish reason.");
  for (const auto& [reason, n] : finished_) {
    out += "kvllm:request_success_total{finished_reason=\"" + reason + "\"} " + Num(n) + "\n";
  }
  Line(&out, "kvllm:request_rejected_total", "counter", "Rejected requests by HTTP status.");
  for (const auto& [status, n] : rejected_) {
    out += "kvllm:request_rejected_total{status=\"" + std::to_string(status) + "\"} " + Num(n) +
           "\n";
  }
  ttft_.Render("kvllm:time_to_first_token_seconds", "Time from arrival to the first token.", &out);
  itl_.Render("kvllm:inter_token_latency_seconds", "Time between two tokens of a sequence.", &out);
  e2e_.Render("kvllm:e2e_request_latency_seconds", "Time from arrival to the last token.", &out);
  queue_.Render("kvllm:request_queue_time_seconds", "Time from arrival to the first scheduled step.",
                &out);
  return out;
}

}  // namespace kvllm::server
