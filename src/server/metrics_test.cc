#include "server/metrics.h"

#include <gtest/gtest.h>

namespace kvllm::server {
namespace {

TEST(HistogramTest, BucketsAreCumulativeWithSumAndCount) {
  Histogram h({0.1, 1.0});
  h.Observe(0.05);
  h.Observe(0.5);
  h.Observe(0.5);
  h.Observe(7);
  std::string out;
  h.Render("x", "help", &out);
  EXPECT_NE(out.find("# TYPE x histogram"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"0.1\"} 1\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"1\"} 3\n"), std::string::npos);
  EXPECT_NE(out.find("x_bucket{le=\"+Inf\"} 4\n"), std::string::npos);
  EXPECT_NE(out.find("x_sum 8.05\n"), std::string::npos);
  EXPECT_NE(out.find("x_count 4\n"), std::string::npos);
}

TEST(MetricsTest, RendersVllmLikeNames) {
  Metrics m;
  m.RecordPromptTokens(10);
  m.RecordGenerationTokens(3);
  m.RecordFinished("stop");
  m.RecordTtft(0.2);
  GaugeSnapshot g;
  g.running = 2;
  g.prefix_queries = 100;
  g.prefix_hits = 96;
  const std::string out = m.Render(g);
  for (const char* line :
       {"kvllm:num_requests_running 2\n", "kvllm:num_requests_waiting 0\n",
        "kvllm:prefix_cache_queries_total 100\n", "kvllm:prefix_cache_hits_total 96\n",
        "kvllm:prompt_tokens_total 10\n", "kvllm:generation_tokens_total 3\n",
        "kvllm:request_success_total{finished_reason=\"stop\"} 1\n",
        "kvllm:time_to_first_token_seconds_count 1\n", "kvllm:kv_cache_usage_perc 0\n",
        "kvllm:num_preemptions_total 0\n", "kvllm:e2e_request_latency_seconds_count 0\n",
        "kvllm:inter_token_latency_seconds_count 0\n"}) {
    EXPECT_NE(out.find(line), std::string::npos) << line;
  }
}

}  // namespace
}  // namespace kvllm::server
