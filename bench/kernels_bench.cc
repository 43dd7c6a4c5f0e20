// Kernel and MatMul throughput. Matrix x vector is memory bound: watch bytes_per_second (weight
// bytes streamed). Prefill (n_tok > 1) is compute bound: watch FLOP/s.
//   kernels_bench --benchmark_filter=MatMul --benchmark_min_time=0.2
// KVLLM_SIMD=scalar|avx2 selects the kernel set MatMul and Kernels() use.
#include <benchmark/benchmark.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstring>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "kv/attention.h"
#include "kv/attention_split.h"
#include "base/huge_pages.h"
#include "kv/kv_cache.h"
#include "tensor/dtype.h"
#include "tensor/fp16.h"
#include "tensor/kernels.h"
#include "tensor/quant.h"
#include "tensor/roofline.h"
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

std::vector<float> RandomFloats(int64_t n, uint32_t seed = 2) {
  std::mt19937 rng(seed);
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

// Args: dtype (ggml number), n_out, n_in, n_tok, threads, repack (1: interleaved where the
// model would load the matrix so, as without --no-repack).
void BM_MatMul(benchmark::State& state) {
  const auto t = static_cast<DType>(state.range(0));
  const int64_t n_out = state.range(1);
  const int64_t n_in = state.range(2);
  const int64_t n_tok = state.range(3);
  ThreadPool pool(static_cast<int>(state.range(4)));
  const bool interleaved = state.range(5) != 0 && PrefersInterleaved(t, n_out, n_in);
  const WeightLayout layout = interleaved ? WeightLayout::kInterleaved16 : WeightLayout::kRows;
  std::vector<uint8_t> w = RandomRows(t, n_out, n_in);
  if (interleaved) {
    const std::vector<uint8_t> rows = w;
    InterleaveRows(t, rows.data(), n_out, n_in, w.data());
  }
  const std::vector<float> x = RandomFloats(n_tok * n_in);  // [n_tok][n_in]
  std::vector<float> y(n_tok * n_out);                      // [n_tok][n_out]
  for (auto _ : state) {
    MatMul(t, w.data(), n_out, n_in, x.data(), n_tok, y.data(), &pool, layout);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(w.size()));
  state.counters["FLOP/s"] = benchmark::Counter(2.0 * n_out * n_in * n_tok * state.iterations(),
                                                benchmark::Counter::kIsRate);
  state.SetLabel(Label(t) + (interleaved ? " interleaved" : ""));
}

// The layout the model loads a matrix of `rows` x 2048 in at this level, and the bytes.
struct DecodeWeights {
  WeightLayout layout;
  HugePageBuffer w;
};
DecodeWeights DecodeMatrices(DType t, int64_t rows, int64_t total_rows) {
  constexpr int64_t kIn = 2048;
  const size_t row_bytes = RowBytes(t, kIn);
  const bool interleaved = PrefersInterleaved(t, rows, kIn);
  DecodeWeights d{interleaved ? WeightLayout::kInterleaved16 : WeightLayout::kRows,
                  HugePageBuffer::Allocate(row_bytes * total_rows)};
  const std::vector<uint8_t> src = RandomRows(t, rows, kIn);  // repeated: speed needs no variety
  for (int64_t m0 = 0; m0 < total_rows; m0 += rows) {
    uint8_t* dst = d.w.data() + m0 * row_bytes;
    if (d.layout == WeightLayout::kInterleaved16) {
      InterleaveRows(t, src.data(), rows, kIn, dst);
    } else {
      std::copy(src.begin(), src.end(), dst);
    }
  }
  return d;
}

// FLOP/s of the roofline's FMA loop on one thread, measured on first use.
double OneCoreFmaPeak() {
  static const double peak = [] {
    ThreadPool pool(1);
    return MeasureFmaPeak(pool, 5);
  }();
  return peak;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

// Decode (one token, `threads` threads) through 512 Mi weights of 2048 columns (F16 1 GiB, Q8_0
// 570 MB, Q4_0 295 MB: past the caches), cut into matrices of `rows` rows, one MatMul each,
// in the layout the model loads them in (Q8_0/Q4_0 interleaved at the AVX-512 level): a token
// of TinyLlama runs 111 MatMuls of 256 to 32,000 rows. Each iteration first reads the same
// bytes with the roofline's read loop, so the counter `of_read`, the median over iterations
// of the MatMuls' rate over the read loop's, compares the two at the same minute of a shared
// machine's bandwidth; bytes_per_second is the MatMuls' alone. Args: dtype, rows (262144: the
// whole stack as one matrix), threads (of the pool both loops run on). One thread reads the
// matrices as one stream, two threads each its half of every matrix in turn.
void BM_DecodeStream(benchmark::State& state) {
  const auto t = static_cast<DType>(state.range(0));
  const int64_t rows = state.range(1);
  constexpr int64_t kIn = 2048, kRows = 262144;
  ThreadPool pool(static_cast<int>(state.range(2)));
  const size_t row_bytes = RowBytes(t, kIn);
  const DecodeWeights d = DecodeMatrices(t, rows, kRows);
  const std::vector<float> x = RandomFloats(kIn);
  std::vector<float> y(kRows);
  const auto read_sum =
      Kernels().level >= SimdLevel::kAvx2 ? internal::ReadSum_avx2 : internal::ReadSum_scalar;
  constexpr int64_t kChunkWords = (1 << 20) / 8;
  const auto* words = reinterpret_cast<const uint64_t*>(d.w.data());
  const int64_t n_chunks = static_cast<int64_t>(row_bytes * kRows / 8) / kChunkWords;
  struct alignas(64) Sum {  // a cache line per thread
    uint64_t value = 0;
  };
  std::vector<Sum> sums(pool.size());
  std::vector<double> read_times, ratios;
  for (auto _ : state) {
    auto start = std::chrono::steady_clock::now();
    pool.ParallelFor(n_chunks, [&](int64_t c, int thread) {
      sums[thread].value += read_sum(words + c * kChunkWords, kChunkWords);
    });
    const double read_s = Seconds(start);
    start = std::chrono::steady_clock::now();
    for (int64_t m0 = 0; m0 < kRows; m0 += rows) {
      MatMul(t, d.w.data() + m0 * row_bytes, rows, kIn, x.data(), 1, y.data() + m0, &pool,
             d.layout);
    }
    const double matmul_s = Seconds(start);
    state.SetIterationTime(matmul_s);
    read_times.push_back(read_s);
    ratios.push_back(read_s / matmul_s);
    benchmark::ClobberMemory();
  }
  benchmark::DoNotOptimize(sums.data());
  // The shared machine's bandwidth jumps between levels within seconds, and the MatMuls keep
  // up with a slow read loop better than with a fast one: `of_fast_read` is the median over
  // the iterations whose read loop was faster than the median one.
  std::vector<double> fast;
  if (!read_times.empty()) {
    std::vector<double> sorted = read_times;
    std::sort(sorted.begin(), sorted.end());
    const double median_read = sorted[sorted.size() / 2];
    for (size_t i = 0; i < ratios.size(); ++i) {
      if (read_times[i] < median_read) fast.push_back(ratios[i]);
    }
  }
  const auto median = [](std::vector<double> v) {
    std::sort(v.begin(), v.end());
    return v.empty() ? 0.0 : v[v.size() / 2];
  };
  state.counters["of_read"] = median(ratios);
  state.counters["of_fast_read"] = median(fast);
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(row_bytes * kRows));
  state.SetLabel(Label(t) + (d.layout == WeightLayout::kInterleaved16 ? " interleaved" : ""));
}

// The same kernels on one thread over 256 rows of 2048 in the model's layout, again and
// again, so the weights (F16 1 MiB, Q8_0 544 KiB, Q4_0 288 KiB) stay in the L2: the rate
// one core computes at, which decode needs to exceed each core's share of the bandwidth.
void BM_DecodeResident(benchmark::State& state) {
  const auto t = static_cast<DType>(state.range(0));
  constexpr int64_t kIn = 2048, kRows = 256;
  ThreadPool pool(1);
  const DecodeWeights d = DecodeMatrices(t, kRows, kRows);
  const std::vector<float> x = RandomFloats(kIn);
  std::vector<float> y(kRows);
  for (auto _ : state) {
    MatMul(t, d.w.data(), kRows, kIn, x.data(), 1, y.data(), &pool, d.layout);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(state.iterations() * static_cast<int64_t>(RowBytes(t, kIn) * kRows));
  state.SetLabel(Label(t) + (d.layout == WeightLayout::kInterleaved16 ? " interleaved" : ""));
}

// A cache of `layers` x `heads` KV heads of 64 dimensions in 16-slot blocks, holding one
// sequence of `depth` tokens whose rows cycle through a few random ones. `interleaved`: a
// second sequence took every other block as the two grew, as two sequences decoding side by
// side do, so that no two of the first one's blocks are adjacent in the pool.
struct AttentionCache {
  static constexpr int32_t kGroup = 8, kHeadDim = 64, kBlock = 16;
  KVLayout layout;
  std::unique_ptr<KVCache> kv;
  const SeqId seq{0};

  // `second`: the slots of a second sequence, after the first (SeqId(1); 0: none).
  AttentionCache(const KVFormat& format, int32_t layers, int32_t heads, int32_t depth,
                 bool interleaved = false, int32_t second = 0)
      : layout(KVLayout::Make(KVShape{layers, heads, kHeadDim}, kBlock, format, format).value()),
        kv(std::make_unique<KVCache>(layout, (interleaved ? 2 : 1) * (depth / kBlock + 1) +
                                                 second / kBlock + 1)) {
    if (interleaved) {
      for (int32_t pos = 0; pos < depth; pos += kBlock) {
        kv->Append(seq, std::min(kBlock, depth - pos));
        kv->Append(SeqId(1), kBlock);
      }
    } else {
      kv->Append(seq, depth);
    }
    std::vector<std::vector<float>> rows;
    for (int i = 0; i < 7; ++i) rows.push_back(RandomFloats(heads * kHeadDim, 10 + i));
    if (second > 0) kv->Append(SeqId(1), second);
    for (int32_t layer = 0; layer < layers; ++layer) {
      for (int32_t pos = 0; pos < depth; ++pos) {
        kv->WriteK(seq, layer, pos, rows[pos % 7].data());
        kv->WriteV(seq, layer, pos, rows[(pos + 3) % 7].data());
      }
      for (int32_t pos = 0; pos < second; ++pos) {
        kv->WriteK(SeqId(1), layer, pos, rows[pos % 7].data());
        kv->WriteV(SeqId(1), layer, pos, rows[(pos + 3) % 7].data());
      }
    }
  }
  AttentionArgs Args(int32_t layer, int32_t head, int32_t depth, const float* q,
                     SeqId s = SeqId(0)) const {
    return AttentionArgs{kv.get(), s, layer, head, kGroup, 0.125f, {{0, depth, q}}, 1};
  }
  int64_t KVBytes(int32_t depth) const {
    return int64_t{depth} *
           static_cast<int64_t>(2 * RowBytes(layout.k_format().row_type(), kHeadDim));
  }
};

const char* const kAttentionFormats[] = {"f16", "q8_0"};

// One decode step's attention for one KV head and its query group (TinyLlama: 8 query heads of
// 64 per KV head) over `depth` cached tokens, on one thread. bytes_per_second counts the K and
// V bytes read. Args: kv format index (f16, q8_0), depth, layers: with 1 (one KV head) the
// cache stays in the caches (L2 at depth 512: 128 KiB of f16 K and V); with 22 (TinyLlama's 22
// layers x 4 KV heads, 88 MiB of f16 KV at 4096) each call attends the next (layer, head), so
// K and V come from memory as in decode. An f16 K and V cost one FMA lane a query head per
// dimension for q.k and one for the weighted sum, so f16 rows also report `flops_per_s` (2
// per multiply-add) and `of_fma_peak`: that rate over one core's FMA peak, the roofline's
// register-only loop on one thread (measured once per process).
void BM_Attention(benchmark::State& state) {
  const char* name = kAttentionFormats[state.range(0)];
  const int32_t depth = static_cast<int32_t>(state.range(1));
  const int32_t layers = static_cast<int32_t>(state.range(2));
  const int32_t heads = layers == 1 ? 1 : 4;
  const AttentionCache cache(*KVFormat::FromName(name), layers, heads, depth);
  const std::vector<float> q = RandomFloats(AttentionCache::kGroup * AttentionCache::kHeadDim);
  std::vector<float> out(q.size());
  std::vector<float> scratch(AttentionScratchFloats(cache.layout, AttentionCache::kGroup));
  const bool f16 = cache.layout.k_format().row_type() == DType::kF16;
  const double peak = f16 ? OneCoreFmaPeak() : 0;
  int32_t next = 0;
  const auto start = std::chrono::steady_clock::now();
  for (auto _ : state) {
    AttendGroup(cache.Args(next / heads, next % heads, depth, q.data()), out.data(),
                scratch.data());
    benchmark::DoNotOptimize(out.data());
    next = (next + 1) % (layers * heads);
  }
  const double seconds = Seconds(start);
  state.SetBytesProcessed(state.iterations() * cache.KVBytes(depth));
  state.SetLabel(std::string(name) + "/" + SimdLevelName(Kernels().level));
  if (f16) {
    const double flops = 4.0 * depth * AttentionCache::kHeadDim * AttentionCache::kGroup *
                         static_cast<double>(state.iterations());
    // Wall-clock rates, as the peak is.
    state.counters["flops_per_s"] = flops / seconds;
    state.counters["of_fma_peak"] = flops / seconds / peak;
  }
}

// Attention's kernels one at a time, as AttendGroup calls them for one KV head's 8 query heads
// of 64, over 512 slots (K and V 64 KiB each in f16, in L2). Args: part (0: q.k against an
// f16 K, scores_f16t, in one call; 1: the softmax's exp, exp_sum over each head's 512 scores;
// 2: an f16 V's weighted sum, weighted_rows; 3: q.k against a q8_0 K, scores_q8t, a call per
// block of 16 slots; 4: a q8_0 V's weighted sum). The f16 kernels report `of_fma_peak`: their
// multiply-adds' rate over one core's FMA peak (as BM_Attention does), the arithmetic alone;
// q8_0 ones report `vs_f16`, their time over the f16 kernel's for the same work, timed in the
// same call.
void BM_AttentionKernels(benchmark::State& state) {
  constexpr int64_t kSlots = 512, kD = AttentionCache::kHeadDim, kG = AttentionCache::kGroup;
  constexpr int64_t kTile = AttentionCache::kBlock;  // K's slots a dimension-major tile holds
  const int part = static_cast<int>(state.range(0));
  const std::vector<uint8_t> k = RandomRows(DType::kF16, kSlots, kD);
  const std::vector<uint8_t> v = RandomRows(DType::kF16, kSlots, kD);
  const std::vector<uint8_t> v8 = RandomRows(DType::kQ8_0, kSlots, kD);
  // A q8_0 K's tiles: random codes, every scale 1/64.
  const Q8DimsLayout q8{kTile};
  const int64_t tile_bytes = kD / kQK * q8.GroupBytes();
  std::vector<uint8_t> k8 = RandomRows(DType::kQ8_0, kSlots, kD);
  for (int64_t t = 0; t < kSlots / kTile; ++t) {
    for (int64_t b = 0; b < kD / kQK; ++b) {
      for (int64_t j = 0; j < kTile; ++j) {
        const uint16_t scale = F32ToF16(1.0f / 64);
        std::memcpy(&k8[t * tile_bytes + q8.ScaleOffset(b, j)], &scale, sizeof scale);
      }
    }
  }
  const std::vector<float> q = RandomFloats(kG * kD);
  std::vector<BlockQ8Act> q_act(kG * kD / kQK);
  for (int64_t g = 0; g < kG; ++g) Kernels().quantize_act(&q[g * kD], &q_act[g * kD / kQK], kD);
  std::vector<float> scores = RandomFloats(kG * kSlots, 3);
  std::vector<float> y(kG * kD);
  const KernelSet& ks = Kernels();
  auto run = [&](int which) {
    switch (which) {
      case 0:
        return ks.scores_f16t(reinterpret_cast<const uint16_t*>(k.data()), kTile, 0, kSlots,
                              q.data(), kG, kD, 0.125f, scores.data(), kSlots, nullptr);
      case 1:
        for (int64_t g = 0; g < kG; ++g) {
          benchmark::DoNotOptimize(ks.exp_sum(scores.data() + g * kSlots, kSlots, 1.0f));
        }
        return;
      case 2:
        return ks.weighted_rows(scores.data(), kSlots, kG, DType::kF16, v.data(), kSlots, kD,
                                y.data(), nullptr);
      case 3:
        for (int64_t t = 0; t < kSlots / kTile; ++t) {
          ks.scores_q8t(&k8[t * tile_bytes], kTile, 0, kTile, q_act.data(), kG, kD, 0.125f,
                        scores.data() + t * kTile, kSlots, nullptr);
        }
        return;
      default:
        return ks.weighted_rows(scores.data(), kSlots, kG, DType::kQ8_0, v8.data(), kSlots, kD,
                                y.data(), nullptr);
    }
  };
  const double peak = part == 0 || part == 2 ? OneCoreFmaPeak() : 0;
  const auto start = std::chrono::steady_clock::now();
  double q8_seconds = 0, f16_seconds = 0;  // parts 3 and 4, each call timed alike
  for (auto _ : state) {
    const auto call = std::chrono::steady_clock::now();
    run(part);
    benchmark::ClobberMemory();
    if (part >= 3) {
      q8_seconds += Seconds(call);
      state.PauseTiming();
      const auto f16_call = std::chrono::steady_clock::now();
      run(part == 3 ? 0 : 2);
      benchmark::ClobberMemory();
      f16_seconds += Seconds(f16_call);
      state.ResumeTiming();
    }
  }
  const double seconds = Seconds(start);
  if (part == 0 || part == 2) {
    const double flops = 2.0 * kSlots * kD * kG * static_cast<double>(state.iterations());
    state.counters["of_fma_peak"] = flops / seconds / peak;
  }
  if (part >= 3) state.counters["vs_f16"] = q8_seconds / f16_seconds;
  state.SetLabel(SimdLevelName(ks.level));
}

// A whole TinyLlama decode step's attention at `depth`: 22 layers, each with its 4 KV heads
// attended by `threads` threads as the model does, both cores reading K and V past the L2
// (88 MiB of f16 from memory at 4,096 tokens; 22 MiB at 1,024, mostly in the L3). Args: kv
// format index, depth, threads, interleaved (the sequence's blocks not adjacent in the pool;
// AttentionCache), joins: 1 waits for every thread after each layer, as the model must (the
// next layer needs this one's output), each thread attending its heads whole (the model
// before AttentionSplit); 2 the same through AttentionSplit (threads that finish first take
// chunks of the others' heads, as the model does); 0 gives each thread its heads of every
// layer in one task, so that the cost of those waits, and of the threads' imbalance at each,
// shows.
void BM_AttentionStep(benchmark::State& state) {
  constexpr int32_t kLayers = 22, kHeads = 4;
  const char* name = kAttentionFormats[state.range(0)];
  const int32_t depth = static_cast<int32_t>(state.range(1));
  ThreadPool pool(static_cast<int>(state.range(2)));
  const AttentionCache cache(*KVFormat::FromName(name), kLayers, kHeads, depth,
                             state.range(3) != 0);
  const int64_t group_floats = AttentionCache::kGroup * AttentionCache::kHeadDim;
  const std::vector<float> q = RandomFloats(kHeads * group_floats);
  std::vector<float> out(q.size());
  // Whole cache lines apart, as the model keeps them: no line written by both threads.
  const int64_t scratch_floats =
      (AttentionScratchFloats(cache.layout, AttentionCache::kGroup) + 15) / 16 * 16 + 16;
  std::vector<float> scratch(scratch_floats * pool.size());
  auto attend = [&](int32_t layer, int64_t h, int thread) {
    AttendGroup(cache.Args(layer, static_cast<int32_t>(h), depth, &q[h * group_floats]),
                &out[h * group_floats], &scratch[thread * scratch_floats]);
  };
  const int64_t joins = state.range(4);
  const int64_t n_threads = pool.size();
  AttentionSplit split;
  split.Reserve(kHeads, pool.size(), AttentionCache::kGroup, AttentionCache::kHeadDim);
  for (auto _ : state) {
    if (joins == 2) {
      for (int32_t layer = 0; layer < kLayers; ++layer) {
        split.Run(
            pool, kHeads,
            [&](int32_t h, int) { return cache.Args(layer, h, depth, &q[h * group_floats]); },
            [&](int32_t h) { return &out[h * group_floats]; }, scratch.data(), scratch_floats);
      }
    } else if (joins == 1) {
      for (int32_t layer = 0; layer < kLayers; ++layer) {
        pool.ParallelFor(kHeads, [&](int64_t h, int thread) { attend(layer, h, thread); });
      }
    } else {
      pool.ParallelFor(n_threads, [&](int64_t t, int thread) {
        for (int32_t layer = 0; layer < kLayers; ++layer) {
          for (int64_t h = t * kHeads / n_threads; h < (t + 1) * kHeads / n_threads; ++h) {
            attend(layer, h, thread);
          }
        }
      });
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * kLayers * kHeads * cache.KVBytes(depth));
  state.SetLabel(std::string(name) + "/" + SimdLevelName(Kernels().level));
}

// A decode step's attention for two sequences side by side, one at `depth` and one at
// `second` tokens (22 layers x 4 KV heads each, f16), as a server batch holds them. Args:
// depth, second, split: 0 gives each thread one sequence's heads (the model before
// AttentionSplit: a batch of two rows on two threads was two tasks, a row each), 1 shares
// the 8 (sequence, head) pairs of each layer through AttentionSplit.
void BM_AttentionBatch(benchmark::State& state) {
  constexpr int32_t kLayers = 22, kHeads = 4;
  const auto depth = static_cast<int32_t>(state.range(0));
  const auto second = static_cast<int32_t>(state.range(1));
  ThreadPool pool(2);
  const AttentionCache cache(*KVFormat::FromName("f16"), kLayers, kHeads, depth, false, second);
  const int64_t group_floats = AttentionCache::kGroup * AttentionCache::kHeadDim;
  const std::vector<float> q = RandomFloats(2 * kHeads * group_floats);
  std::vector<float> out(q.size());
  const int64_t scratch_floats =
      (AttentionScratchFloats(cache.layout, AttentionCache::kGroup) + 15) / 16 * 16 + 16;
  std::vector<float> scratch(scratch_floats * pool.size());
  // Pair p: sequence p / kHeads, head p % kHeads.
  auto args = [&](int32_t layer, int32_t p) {
    return cache.Args(layer, p % kHeads, p < kHeads ? depth : second, &q[p * group_floats],
                      SeqId(p / kHeads));
  };
  AttentionSplit split;
  split.Reserve(2 * kHeads, pool.size(), AttentionCache::kGroup, AttentionCache::kHeadDim);
  for (auto _ : state) {
    for (int32_t layer = 0; layer < kLayers; ++layer) {
      if (state.range(2) != 0) {
        split.Run(
            pool, 2 * kHeads, [&](int32_t p, int) { return args(layer, p); },
            [&](int32_t p) { return &out[p * group_floats]; }, scratch.data(), scratch_floats);
        continue;
      }
      pool.ParallelFor(2, [&](int64_t row, int thread) {
        for (int32_t h = 0; h < kHeads; ++h) {
          const auto p = static_cast<int32_t>(row * kHeads + h);
          AttendGroup(args(layer, p), &out[p * group_floats], &scratch[thread * scratch_floats]);
        }
      });
    }
    benchmark::DoNotOptimize(out.data());
  }
  state.SetBytesProcessed(state.iterations() * kLayers * kHeads *
                          (cache.KVBytes(depth) + cache.KVBytes(second)));
}

// Overhead of one ParallelFor with trivial tasks. Args: threads, and whether a second pool
// (as a second engine or the bench's bandwidth probe) sits idle beside it, its worker asleep.
void BM_ParallelFor(benchmark::State& state) {
  ThreadPool pool(static_cast<int>(state.range(0)));
  std::optional<ThreadPool> idle;
  if (state.range(1) != 0) {
    idle.emplace(2);
    idle->ParallelFor(2, [](int64_t, int) {});
    std::this_thread::sleep_for(std::chrono::milliseconds(10));  // past its workers' spin
  }
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

// 2048 x 2048 matrix x vector (decode) and x 64 tokens (prefill), on 1 and 2 threads, in rows
// and in the model's layout.
BENCHMARK(BM_MatMul)
    ->ArgNames({"dtype", "n_out", "n_in", "n_tok", "threads", "repack"})
    ->ArgsProduct({{kF32, kF16, kBF16, kQ8_0, kQ4_0}, {2048}, {2048}, {1, 64}, {1, 2}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_DecodeStream)
    ->ArgNames({"dtype", "rows", "threads"})
    ->ArgsProduct({{kF16, kQ8_0, kQ4_0}, {256, 2048, 262144}, {2}})
    ->ArgsProduct({{kF16, kQ8_0, kQ4_0}, {2048, 262144}, {1}})
    ->UseManualTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_DecodeResident)->ArgNames({"dtype"})->Args({kF16})->Args({kQ8_0})->Args({kQ4_0});

BENCHMARK(BM_Attention)
    ->ArgNames({"kv", "depth", "layers"})
    ->Args({0, 512, 1})
    ->ArgsProduct({{0, 1}, {4096}, {1, 22}})
    ->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_AttentionKernels)->ArgNames({"part"})->DenseRange(0, 4)->Unit(benchmark::kMicrosecond);

BENCHMARK(BM_AttentionBatch)
    ->ArgNames({"depth", "second", "split"})
    ->ArgsProduct({{4096}, {256, 4096}, {0, 1}})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_AttentionStep)
    ->ArgNames({"kv", "depth", "threads", "interleaved", "joins"})
    ->ArgsProduct({{0, 1}, {4096}, {1, 2}, {0, 1}, {1}})
    ->Args({0, 4096, 2, 0, 0})
    ->Args({0, 4096, 2, 0, 2})
    ->Args({1, 4096, 2, 0, 2})
    ->Args({0, 1024, 1, 0, 1})
    ->Args({0, 1024, 2, 0, 1})
    ->UseRealTime()
    ->Unit(benchmark::kMillisecond);

BENCHMARK(BM_ParallelFor)
    ->ArgNames({"threads", "idle_pool"})
    ->ArgsProduct({{1, 2}, {0, 1}})
    ->UseRealTime();

}  // namespace
}  // namespace kvllm

BENCHMARK_MAIN();
