// kvllm's forward pass against the independent numpy reference (tools/reference.py, float64)
// over the same GGUF files. Tolerance: max |kvllm − reference| / max |reference| over a
// position's logits.
#include <gtest/gtest.h>

#include <algorithm>

#include "model/model.h"
#include "tensor/thread_pool.h"
#include "test_support.h"

namespace kvllm {
namespace {

using testing::ReferenceLogits;
using testing::RelativeError;
using testing::TestModel;

const std::vector<int> kPrompt = {1, 300, 17, 42, 99, 260, 5, 77, 150, 33, 400, 8};
constexpr int kDecodeSteps = 16;

struct DecodeRun {
  std::vector<int> tokens;                 // prompt + generated
  std::vector<std::vector<float>> logits;  // after prefill, then after each decode step
};

// Prefill the prompt in one batch, then decode greedily one token per forward.
DecodeRun PrefillThenDecode(const std::string& path, DType kv_type, int block_size = 16,
                            const std::vector<int>& prompt = kPrompt, int threads = 2,
                            bool repack = true) {
  auto model = Model::Load(path, ModelLoadOptions{.repack = repack});
  EXPECT_TRUE(model.ok()) << model.status().message();
  Model& m = **model;
  const int n_vocab = m.config().n_vocab;
  auto layout = KVLayout::Make(m.kv_shape(), block_size, kv_type, kv_type);
  EXPECT_TRUE(layout.ok());
  KVCache kv(layout.value(), static_cast<int32_t>(prompt.size() + kDecodeSteps) / block_size + 2);
  ThreadPool pool(threads);
  SeqId seq(0);
  DecodeRun run{prompt, {}};
  ForwardBatch batch;
  for (size_t i = 0; i < prompt.size(); ++i) {
    batch.Add(prompt[i], static_cast<int>(i), seq, i + 1 == prompt.size());
  }
  kv.Append(seq, batch.size());
  for (int step = 0; step <= kDecodeSteps; ++step) {
    std::vector<float> logits(n_vocab);
    m.Forward(batch, kv, pool, logits.data());
    const int next =
        static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
    run.logits.push_back(std::move(logits));
    if (step == kDecodeSteps) break;
    batch.Clear();
    batch.Add(next, static_cast<int>(run.tokens.size()), seq, true);
    run.tokens.push_back(next);
    kv.Append(seq, 1);
  }
  return run;
}

// Checks every step's logits against the reference at the same position: each within
// `outlier_tolerance`, and their median within `tolerance` (the same when not given).
void ExpectMatchesReference(const DecodeRun& run, const std::string& ref_model, double tolerance,
                            double outlier_tolerance = 0) {
  outlier_tolerance = std::max(outlier_tolerance, tolerance);
  auto ref = ReferenceLogits(ref_model, run.tokens);
  ASSERT_EQ(ref.size(), run.tokens.size());
  const size_t prompt_size = run.tokens.size() - kDecodeSteps;
  std::vector<double> errors;
  for (size_t step = 0; step < run.logits.size(); ++step) {
    const size_t pos = prompt_size - 1 + step;
    errors.push_back(RelativeError(run.logits[step].data(), ref[pos]));
    EXPECT_LT(errors.back(), outlier_tolerance) << "step " << step << " (position " << pos << ")";
  }
  std::nth_element(errors.begin(), errors.begin() + errors.size() / 2, errors.end());
  EXPECT_LT(errors[errors.size() / 2], tolerance) << "the median step";
}

TEST(ReferenceTest, F32ModelMatchesNumpyAfterPrefillAndDecode) {
  const std::string path = testing::TinyModel();
  ExpectMatchesReference(PrefillThenDecode(path, DType::kF32), path, 1e-4);
}

// At 700 tokens (3 chunks) a decode step has 2 (token, kv head) pairs for 2 threads, and the
// thread that finishes its pair first takes the back of the other's (AttentionSplit): pieces
// attended in parallel and merged. One thread attends each pair whole. Both match the
// reference.
TEST(ReferenceTest, AttentionSharedAcrossThreadsMatchesNumpy) {
  const std::string path =
      TestModel("tiny-f32-ctx1024-s3", "--preset tiny --type f32 --ctx 1024 --seed 3");
  std::vector<int> prompt(700);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = static_cast<int>((i * 37 + 11) % 500) + 1;
  const DecodeRun split = PrefillThenDecode(path, DType::kF32, 16, prompt, 2);
  const DecodeRun whole = PrefillThenDecode(path, DType::kF32, 16, prompt, 1);
  ExpectMatchesReference(split, path, 1e-4);
  ASSERT_EQ(split.tokens, whole.tokens);
  for (size_t step = 0; step < split.logits.size(); ++step) {
    EXPECT_LT(RelativeError(split.logits[step], whole.logits[step]), 1e-5) << "step " << step;
  }
}

TEST(ReferenceTest, TiedOutputEmbeddingMatchesNumpy) {
  const std::string path =
      TestModel("tiny-f32-tied-s8", "--preset tiny --type f32 --tied --seed 8");
  ExpectMatchesReference(PrefillThenDecode(path, DType::kF32), path, 1e-4);
}

TEST(ReferenceTest, MultiHeadWithoutGqaMatchesNumpy) {
  const std::string path = TestModel("tiny-f32-mha-s9",
                                     "--preset tiny --type f32 --n-kv-heads 4 --seed 9");
  ExpectMatchesReference(PrefillThenDecode(path, DType::kF32), path, 1e-4);
}

// A quantized file against the reference reading the same file: only kvllm's f32 arithmetic
// differs, so the f32 tolerance holds, with one exception. The activations of Q8_0 and Q4_0
// matrices are rounded to 8 bits, and a value that f32 moves across a half step from where
// float64 puts it rounds the other way: one such code moves the step's logits by up to about
// 1e-2 on this small model, and later steps much less. Any correct f32 engine meets some: on
// the Q4_0 file 6 of 17 steps are off by 2e-3 to 9.3e-3, the others by 6e-5 at most, with the
// scalar kernels and the rows as GGUF stores them as with the interleaved AVX-512 ones (the
// AVX-512 kernels on rows happened to round every code as float64 does). So for those files
// every step is held to one such code's reach, and the median step to the f32 tolerance.
TEST(ReferenceTest, QuantizedFilesMatchNumpyOnTheSameFile) {
  for (const char* type : {"f16", "bf16", "q8_0", "q4_0"}) {
    SCOPED_TRACE(type);
    const std::string path = TestModel(std::string("tiny-") + type + "-s7",
                                       std::string("--preset tiny --seed 7 --type ") + type);
    const bool rounds_activations = type[0] == 'q';
    ExpectMatchesReference(PrefillThenDecode(path, DType::kF32), path, 1e-4,
                           rounds_activations ? 2e-2 : 1e-4);
    if (rounds_activations) {
      SCOPED_TRACE("--no-repack");
      ExpectMatchesReference(PrefillThenDecode(path, DType::kF32, 16, kPrompt, 2, false), path,
                             1e-4, 2e-2);
    }
  }
}

// --no-repack keeps the file's rows; otherwise the Q4_0 matrices are interleaved where the
// kernels prefer it (the AVX-512 level), and the file's copy is not what the model reads.
TEST(ReferenceTest, RepackInterleavesOnlyWhereTheKernelsPreferIt) {
  const std::string path = TestModel("tiny-q4_0-s7", "--preset tiny --seed 7 --type q4_0");
  for (bool repack : {false, true}) {
    auto model = Model::Load(path, ModelLoadOptions{.repack = repack});
    ASSERT_TRUE(model.ok()) << model.status().message();
    const Matrix& wq = (*model)->weights().layers[0].wq;
    const bool interleaved = repack && PrefersInterleaved(wq.type, wq.n_out, wq.n_in);
    EXPECT_EQ(wq.layout,
              interleaved ? WeightLayout::kInterleaved16 : WeightLayout::kRows);
    EXPECT_EQ(wq.data == (*model)->file().FindTensor("blk.0.attn_q.weight")->data, !interleaved);
  }
}

// The same random model written in lower precision, against the f32 model's reference.
// Tolerances (relative, see above) are about twice what was measured on this model when they
// were set (f16 9.6e-4, bf16 7.9e-3, q8_0 2.6e-2, q4_0 0.40; q8_0 3.6e-2 once activations
// were rounded to 8 bits for Q8_0 and Q4_0 matrices); the errors must also rank
// with the formats' precision.
TEST(ReferenceTest, QuantizedFilesStayCloseToF32Reference) {
  const std::string f32 = testing::TinyModel();
  const struct {
    const char* type;
    double tolerance;
  } cases[] = {{"f16", 2e-3}, {"bf16", 2e-2}, {"q8_0", 5e-2}, {"q4_0", 0.8}};
  double previous = 0;
  for (const auto& c : cases) {
    SCOPED_TRACE(c.type);
    const std::string path = TestModel(std::string("tiny-") + c.type + "-s7",
                                       std::string("--preset tiny --seed 7 --type ") + c.type);
    DecodeRun run = PrefillThenDecode(path, DType::kF32);
    auto ref = ReferenceLogits(f32, run.tokens);
    double worst = 0;
    for (size_t step = 0; step < run.logits.size(); ++step) {
      worst =
          std::max(worst, RelativeError(run.logits[step].data(), ref[kPrompt.size() - 1 + step]));
    }
    std::printf("%s weights vs f32 reference: max relative logit error %.2e\n", c.type, worst);
    EXPECT_LT(worst, c.tolerance);
    EXPECT_GT(worst, previous);
    previous = worst;
  }
}

// f16 KV rounds K and V to 11 significant bits; the error stays small.
TEST(ReferenceTest, F16KvStaysCloseToReference) {
  const std::string path = testing::TinyModel();
  ExpectMatchesReference(PrefillThenDecode(path, DType::kF16), path, 5e-3);
}

}  // namespace
}  // namespace kvllm
