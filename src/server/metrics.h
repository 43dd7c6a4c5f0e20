// Server metrics in the Prometheus text format, named like vLLM's under a `kvllm:` prefix:
// counters and latency histograms the engine loop records, gauges read when scraped.
// Thread-safe: the engine loop records, HTTP threads render.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "kv/store_tiers.h"

namespace kvllm::server {

class Histogram {
 public:
  explicit Histogram(std::vector<double> upper_bounds);
  void Observe(double v);
  // `name`_bucket{le=...}, `name`_sum and `name`_count lines.
  void Render(const std::string& name, const std::string& help, std::string* out) const;
  uint64_t count() const { return count_; }

 private:
  std::vector<double> bounds_;
  std::vector<uint64_t> counts_;  // per bucket, not cumulative; last is +Inf
  double sum_ = 0;
  uint64_t count_ = 0;
};

// Gauges of the moment, filled by the engine loop when /metrics is scraped.
struct GaugeSnapshot {
  int32_t running = 0;
  int32_t waiting = 0;
  double kv_usage = 0;  // blocks held by sequences / blocks in the pool
  int32_t blocks_total = 0;
  int32_t blocks_used = 0;
  int32_t blocks_cached_free = 0;
  int64_t prefix_queries = 0;  // tokens looked up in the prefix cache
  int64_t prefix_hits = 0;     // tokens found
  int64_t preemptions = 0;
  int64_t evictions = 0;       // cached blocks evicted for memory
  std::vector<TierStats> tiers;  // persistent tiers (disk, Redis)
};

class Metrics {
 public:
  Metrics();
  void RecordPromptTokens(int64_t n);
  void RecordGenerationTokens(int64_t n);
  void RecordFinished(const std::string& reason);
  void RecordRejected(int status);
  void RecordTtft(double seconds);
  void RecordInterToken(double seconds);
  void RecordE2e(double seconds);
  void RecordQueueTime(double seconds);
  std::string Render(const GaugeSnapshot& g) const;

 private:
  mutable std::mutex mu_;
  int64_t prompt_tokens_ = 0;
  int64_t generation_tokens_ = 0;
  std::map<std::string, int64_t> finished_;  // by finish reason
  std::map<int, int64_t> rejected_;          // by HTTP status
  Histogram ttft_, itl_, e2e_, queue_;
};

}  // namespace kvllm::server
