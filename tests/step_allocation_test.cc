// A decode step allocates nothing (issue "Fast kernels": no allocation on the hot path). This
// binary counts every operator new of the process, on all threads; after a warm-up step has
// sized the model's scratch, Model::Forward of further decode steps must not call it, on the
// paths a step can take: one sequence (attention shared while it runs), a batch of
// sequences, quantized weights and KV, and a sliding window with sinks.
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <new>

#include "kv/kv_cache.h"
#include "model/model.h"
#include "tensor/thread_pool.h"
#include "test_support.h"

namespace {
std::atomic<int64_t> g_allocations{0};

void* Allocate(std::size_t n, std::size_t align) {
  g_allocations.fetch_add(1, std::memory_order_relaxed);
  n = n == 0 ? 1 : n;
  void* p = align <= alignof(std::max_align_t)
                ? std::malloc(n)
                : std::aligned_alloc(align, (n + align - 1) / align * align);
  if (p == nullptr) throw std::bad_alloc();
  return p;
}
}  // namespace

void* operator new(std::size_t n) { return Allocate(n, alignof(std::max_align_t)); }
void* operator new(std::size_t n, std::align_val_t a) {
  return Allocate(n, static_cast<std::size_t>(a));
}
void operator delete(void* p) noexcept { std::free(p); }
void operator delete(void* p, std::size_t) noexcept { std::free(p); }
void operator delete(void* p, std::align_val_t) noexcept { std::free(p); }
void operator delete(void* p, std::size_t, std::align_val_t) noexcept { std::free(p); }

namespace kvllm {
namespace {

struct Case {
  std::string model_name, model_args;
  DType kv;
  int32_t n_seqs;
  KVWindow window;
};

// Prefills n_seqs short prompts, runs one warm-up decode step, then counts the allocations in
// Model::Forward of `steps` more (each a token of every sequence, positions crossing block
// boundaries; the cache's block tables, grown by KVCache::Append, are the caller's).
int64_t AllocationsOfDecodeSteps(const Case& c, int steps) {
  auto loaded = Model::Load(testing::TestModel(c.model_name, c.model_args));
  EXPECT_TRUE(loaded.ok()) << loaded.status().message();
  if (!loaded.ok()) return -1;
  Model& model = **loaded;
  auto layout = KVLayout::Make(model.kv_shape(), 16, c.kv, c.kv);
  EXPECT_TRUE(layout.ok());
  KVCache kv(*layout, 64, c.window);
  ThreadPool pool(2);
  std::vector<float> logits(int64_t{c.n_seqs} * model.config().n_vocab);
  ForwardBatch batch;
  std::vector<int32_t> pos(c.n_seqs, 0);
  const auto step = [&](int32_t n_tok) {
    batch.Clear();
    for (int32_t s = 0; s < c.n_seqs; ++s) {
      kv.Append(SeqId(s), n_tok);
      for (int32_t i = 0; i < n_tok; ++i, ++pos[s]) {
        batch.Add((7 * pos[s] + s) % 500, pos[s], SeqId(s), i + 1 == n_tok);
      }
    }
    const int64_t before = g_allocations.load();
    model.Forward(batch, kv, pool, logits.data());
    return g_allocations.load() - before;
  };
  step(5);  // prefill
  step(1);  // sizes what decode needs
  int64_t during = 0;
  for (int i = 0; i < steps; ++i) during += step(1);
  return during;
}

TEST(StepAllocationTest, OneSequenceDecodesWithoutAllocating) {
  EXPECT_EQ(AllocationsOfDecodeSteps({"tiny-f32-s7", "--preset tiny --type f32 --seed 7",
                                      DType::kF16, 1, {}},
                                     40),
            0);
}

TEST(StepAllocationTest, QuantizedBatchDecodesWithoutAllocating) {
  // 20 sequences x 2 KV heads: more (token, head) pairs than the shared path takes.
  EXPECT_EQ(AllocationsOfDecodeSteps({"tiny-q4_0-hd32-s7",
                                      "--preset tiny --seed 7 --type q4_0 --n-heads 2 "
                                      "--n-kv-heads 2",
                                      DType::kQ8_0, 20, {}},
                                     40),
            0);
}

TEST(StepAllocationTest, WindowWithSinksDecodesWithoutAllocating) {
  EXPECT_EQ(AllocationsOfDecodeSteps({"tiny-q8_0-s7", "--preset tiny --seed 7 --type q8_0",
                                      DType::kF16, 2, KVWindow{.window = 16, .sinks = 4}},
                                     40),
            0);
}

}  // namespace
}  // namespace kvllm
