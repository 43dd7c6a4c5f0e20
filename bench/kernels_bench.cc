// Kernel and MatMul throughput. Matrix x vector is memory bound: watch bytes_per_second (weight
// bytes streamed). Prefill (n_tok > 1) is compute bound: watch FLOP/s.
//   kernels_bench --benchmark_filter=MatMul --benchmark_min_time=0.2
// KVLLM_SIMD=scalar|avx2 selects the kernel set MatMul and Kernels() use.
#include <benchmark/benchmark.h>

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "kv/attention.h"
#include "kv/kv_cache.h"
#include "tensor/dtype.h"
#include "tensor/kernels.h"
#include "tensor/quant.h"
#include "tensor/thread_pool.h"

namespace kvllm {
namespace {

// Random weights of type t, [rows][n].
std::vector<uint8_t> RandomRows(DType t, int64_t rows, int64_t n) {
  std::mt19937 rng(1);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> src(n);
  std::vector<uint8_t> out(RowBytes(t, n) * rows);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : src) v = dist(rng);
    QuantizeRow(t, src.data(), out.data() + r * RowBytes(t, n), n);
  }
  return out;
}

std::vector<float> RandomFloats(int64_t n) {
  std::mt19937 rng(2);
  std::uniform_real_distribution<float> dist(-1.0f, 1.0f);
  std::vector<float> x(n);
  for (float& v : x) v = dist(rng);
  return x;
}

std::string Label(DType t) {
  return std::string(DTypeName(t)) + "/" + SimdLevelName(Kernels().level);
}

// Args: dtype (ggml number), n.
void BM_Dot(benchmark::State& state) {
  const auto t = static_cast<DType>(state.range(0));
  const int64_t n = state.range(1);
  const std::vector<uint8_t> row = RandomRows(t, 1, n);
  const std::vector<float> x = RandomFloats(n);
  const KernelSet& ks = Kernels();
  for (auto _ : state) benchmark::DoNotOptimize(ks.dot(t, row.data(), x.data(), n));
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(RowBytes(t, n)));
  state.counters["FLOP/s"] =
      benchmark::Counter(2.0 * n * state.iterations(), benchmark::Counter::kIsRate);
  state.SetLabel(Label(t));
}

// Args: dtype (ggml number), n_out, n_in, n_tok, threads.
void BM_MatMul(benchmark::State& state) {
  const auto t = static_cast<DType>(state.range(0));
  const int64_t n_out = state.range(1);
  const int64_t n_in = state.range(2);
  const int64_t n_tok = state.range(3);
  ThreadPool pool(static_cast<int>(state.range(4)));
  const std::vector<uint8_t> w = RandomRows(t, n_out, n_in);
  const std::vector<float> x = RandomFloats(n_tok * n_in);  // [n_tok][n_in]
  std::vector<float> y(n_tok * n_out);                      // [n_tok][n_out]
  for (auto _ : state) {
    MatMul(t, w.data(), n_out, n_in, x.data(), n_tok, y.data(), &pool);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n_out * n_in * n_tok * state.iterations(),
                                                benchmark::Counter::kIsRate);
  state.SetLabel(Label(t));
}

// One decode step's attention for one KV head and its query group (TinyLlama: 8 query heads of
// 64 per KV head) over `depth` cached tokens, on one thread. bytes_per_second counts the K and
// V bytes read. Args: kv format index (f16, q8_0), depth, layers: with 1 (one KV head) the
// cache stays in L2; with 22 (TinyLlama's 22 layers x 4 KV heads, 88 MiB of f16 KV at 4096)
// each call attends the next (layer, head), so K and V come from memory as in decode.
void BM_Attention(benchmark::State& state) {
  const char* kFormats[] = {"f16", "q8_0"};
  const KVFormat format = *KVFormat::FromName(kFormats[state.range(0)]);
  const int32_t depth = static_cast<int32_t>(state.range(1));
  const int32_t layers = static_cast<int32_t>(state.range(2));
  const int32_t heads = layers == 1 ? 1 : 4;
  constexpr int32_t kGroup = 8, kHeadDim = 64, kBlock = 16;
  auto layout = KVLayout::Make(KVShape{layers, heads, kHeadDim}, kBlock, format, format);
  KVCache kv(*layout, depth / kBlock + 1);
  const SeqId seq(0);
  kv.Append(seq, depth);
  const std::vector<float> kvrow = RandomFloats(heads * kHeadDim);
  for (int32_t layer = 0; layer < layers; ++layer) {
    for (int32_t pos = 0; pos < depth; ++pos) {
      kv.WriteK(seq, layer, pos, kvrow.data());
      kv.WriteV(seq, layer, pos, kvrow.data());
    }
  }
  const std::vector<float> q = RandomFloats(kGroup * kHeadDim);
  std::vector<float> out(kGroup * kHeadDim);
  std::vector<float> scratch(AttentionScratchFloats(kv.layout(), kGroup));
  int32_t next = 0;
  for (auto _ : state) {
    const AttentionArgs args{&kv,   seq, next / heads, next % heads, kGroup, 0.125f,
                             {{0, depth, q.data()}}, 1};
    AttendGroup(args, out.data(), scratch.data());
    benchmark::DoNotOptimize(out.data());
    next = (next + 1) % (layers * heads);
  }
  state.SetBytesProcessed(state.iterations() * int64_t{depth} *
                          static_cast<int64_t>(2 * RowBytes(format.row_type(), kHeadDim)));
  state.SetLabel(std::string(kFormats[state.range(0)]) + "/" + SimdLevelName(Kernels().level));
}

// Overhead of one ParallelFor with trivial tasks. Args: threads.
void BM_ParallelFor(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::vector<int64_t> sink(64 * pool.size());
  for (auto _ : state) {
    pool.ParallelFor(16, [&](int64_t task, int thread) { sink[64 * thread] += task; });
  }
  benchmark::DoNotOptimize(sink.data());
}

constexpr int64_t kF32 = static_cast<int64_t>(DType::kF32);
constexpr int64_t kF16 = static_cast<int64_t>(DType::kF16);
constexpr int64_t kBF16 = static_cast<int64_t>(DType::kBF16);
constexpr int64_t kQ8_0 = static_cast<int64_t>(DType::kQ8_0);
constexpr int64_t kQ4_0 = static_cast<int64_t>(DType::kQ4_0);

BENCHMARK(BM_Dot)
    ->ArgNames({"dtype", "n"})
    ->ArgsProduct({{kF32, kF16, kBF16, kQ8_0, kQ4_0}, {256, 4096}});

// 2048 x 2048 matrix x vector (decode) and x 64 tokens (prefill), on 1 and 2 threads.
BENCHMARK(BM_MatMul)
    ->ArgNames({"dtype", "n_out", "n_in", "n_tok", "threads"})
    ->ArgsProduct({{kF32, kF16, kBF16, kQ8_0, kQ4_0}, {2048}, {2048}, {1, 64}, {1, 2}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_Attention)
    ->ArgNames({"kv", "depth", "layers"})
    ->ArgsProduct({{0, 1}, {4096}, {1, 22}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_ParallelFor)->ArgNames({"threads"})->Arg(1)->Arg(2)->UseRealTime();

}  // namespace
}  // namespace kvllm

BENCHMARK_MAIN();
