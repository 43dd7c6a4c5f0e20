// Conformance with llama.cpp's tokenizer tests on real vocabularies: llama.cpp's
// models/ggml-vocab-NAME.gguf files (vocabulary-only GGUF) with .inp (inputs separated by a
// marker line) and .out (the token ids Hugging Face tokenizers give each input, one line per
// input) files, which llama.cpp's test-tokenizer-0 checks with add_special and parse_special
// off. scripts/fetch-vocab-tests.sh fetches them into the build folder; without the npm
// registry the tests skip.
#include <algorithm>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <ostream>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gtest/gtest.h>

#include "gguf/gguf_file.h"
#include "test_support.h"
#include "tokenizer/tokenizer.h"

namespace kvllm {
namespace {

struct Case {
  std::string input;
  std::vector<TokenId> expected;
};

struct VocabExpectation {
  const char* name;      // ggml-vocab-NAME.gguf
  double min_pass_rate;  // of the .inp cases; vocabularies without cases only load
};

// Names the test parameter in test listings (gtest would print its bytes).
void PrintTo(const VocabExpectation& vocab, std::ostream* os) { *os << vocab.name; }

// llama-spm and llama-bpe are the reference vocabularies of their two models: all cases.
constexpr VocabExpectation kVocabularies[] = {
    {"llama-spm", 1.0},     {"llama-bpe", 1.0},    {"phi-3", 0.99},    {"gpt-2", 0.99},
    {"mpt", 0.99},          {"starcoder", 0.99},   {"refact", 0.99},   {"command-r", 0.99},
    {"falcon", 0.99},       {"qwen2", 0.99},       {"qwen35", 0.99},   {"deepseek-llm", 0.99},
    {"deepseek-coder", 0.99}, {"gemma-4", 0.99},   {"bert-bge", 0.99}, {"nomic-bert-moe", 0.99},
    {"aquila", 0.99},       {"baichuan", 0.99},    {"gpt-neox", 0.99},
};

// Runs the fetch script (once per process) and returns the folder, or "" after GTEST_SKIP's
// reason was written to `skip`.
std::string VocabDir(std::string* skip) {
  static const std::string dir = testing::BinaryDir() + "/vocab-tests";
  static const std::string skip_reason = [] {
    std::string out, err;
    const std::string cmd =
        "bash " + testing::SourceDir() + "/scripts/fetch-vocab-tests.sh " + dir;
    if (testing::RunCommand(cmd, &out, &err) != 0) {
      ADD_FAILURE() << cmd << " failed:\n" << out << err;
      return std::string("fetch failed");
    }
    std::ifstream marker(dir + "/SKIP");
    std::stringstream reason;
    reason << marker.rdbuf();
    return reason.str();
  }();
  *skip = skip_reason;
  return skip_reason.empty() ? dir : "";
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The format test-tokenizer-0 reads: inputs separated by "\n__ggml_vocab_test__\n" (a
// separator at the very end closes the last input), output lines of space-separated ids.
std::vector<Case> ReadCases(const std::string& gguf_path) {
  const std::string inputs = ReadFile(gguf_path + ".inp");
  const std::string outputs = ReadFile(gguf_path + ".out");
  constexpr std::string_view kSeparator = "\n__ggml_vocab_test__\n";
  std::vector<Case> cases;
  for (size_t pos = 0; pos < inputs.size();) {
    const size_t next = inputs.find(kSeparator, pos);
    const size_t end = next == std::string::npos ? inputs.size() : next;
    cases.push_back({inputs.substr(pos, end - pos), {}});
    if (next == std::string::npos) break;
    pos = next + kSeparator.size();
  }
  std::istringstream lines(outputs);
  std::string line;
  for (Case& c : cases) {
    if (!std::getline(lines, line)) {
      ADD_FAILURE() << gguf_path << ".out has fewer lines than the .inp has inputs";
      return {};
    }
    std::istringstream ids(line);
    for (TokenId id; ids >> id;) c.expected.push_back(id);
  }
  return cases;
}

std::string Quoted(std::string_view text) {
  std::string out = "\"";
  for (char c : text) {
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\t') {
      out += "\\t";
    } else {
      out += c;
    }
  }
  return out + "\"";
}

std::string Ids(const std::vector<TokenId>& ids) {
  std::string out;
  for (TokenId id : ids) {
    if (!out.empty()) out += ' ';
    out += std::to_string(id);
  }
  return out;
}

class TokenizerConformanceTest : public ::testing::TestWithParam<VocabExpectation> {};

TEST_P(TokenizerConformanceTest, MatchesLlamaCpp) {
  const VocabExpectation& vocab = GetParam();
  std::string skip;
  const std::string dir = VocabDir(&skip);
  if (dir.empty()) GTEST_SKIP() << skip;
  const std::string path = dir + "/ggml-vocab-" + vocab.name + ".gguf";
  StatusOr<gguf::GgufFile> file = gguf::GgufFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status().message();

  StatusOr<std::string> model = file->GetString("tokenizer.ggml.model");
  ASSERT_TRUE(model.ok()) << model.status().message();
  if (*model != "llama" && *model != "gpt2" && *model != "gemma4") {
    std::printf("%s: skipped (tokenizer model \"%s\" is not supported)\n", vocab.name,
                model->c_str());
    GTEST_SKIP() << "tokenizer model \"" << *model << "\" is not supported";
  }
  StatusOr<Tokenizer> tok = Tokenizer::FromGguf(*file);
  ASSERT_TRUE(tok.ok()) << tok.status().message();

  if (!std::filesystem::exists(path + ".inp")) {
    std::printf("%s: loads (no test cases)\n", vocab.name);
    return;
  }
  const std::vector<Case> cases = ReadCases(path);
  ASSERT_FALSE(cases.empty());
  size_t passed = 0, round_trips = 0;
  for (const Case& c : cases) {
    const std::vector<TokenId> ids = tok->Encode(c.input, /*add_special=*/false);
    if (ids == c.expected) {
      ++passed;
    } else {
      ADD_FAILURE() << vocab.name << ": " << Quoted(c.input) << "\n  expected " << Ids(c.expected)
                    << "\n  got      " << Ids(ids);
    }
    // Whatever the ids, they must spell the input back.
    if (tok->Decode(ids) == c.input) {
      ++round_trips;
    } else {
      ADD_FAILURE() << vocab.name << ": " << Quoted(c.input) << " decodes to "
                    << Quoted(tok->Decode(ids));
    }
  }
  std::printf("%s: %zu/%zu (round trip %zu/%zu)\n", vocab.name, passed, cases.size(),
              round_trips, cases.size());
  EXPECT_GE(static_cast<double>(passed), vocab.min_pass_rate * static_cast<double>(cases.size()))
      << vocab.name << ": " << passed << "/" << cases.size() << " cases pass";
}

INSTANTIATE_TEST_SUITE_P(Vocab, TokenizerConformanceTest, ::testing::ValuesIn(kVocabularies),
                         [](const ::testing::TestParamInfo<VocabExpectation>& info) {
                           std::string name = info.param.name;
                           std::replace(name.begin(), name.end(), '-', '_');
                           return name;
                         });

// A vocabulary added to the fetched files must be added to kVocabularies too.
TEST(TokenizerConformanceFilesTest, EveryFetchedVocabularyIsListed) {
  std::string skip;
  const std::string dir = VocabDir(&skip);
  if (dir.empty()) GTEST_SKIP() << skip;
  size_t found = 0;
  for (const auto& entry : std::filesystem::directory_iterator(dir)) {
    const std::string file = entry.path().filename().string();
    constexpr std::string_view kPrefix = "ggml-vocab-", kSuffix = ".gguf";
    if (!file.starts_with(kPrefix) || !file.ends_with(kSuffix)) continue;
    ++found;
    const std::string name =
        file.substr(kPrefix.size(), file.size() - kPrefix.size() - kSuffix.size());
    EXPECT_TRUE(std::any_of(std::begin(kVocabularies), std::end(kVocabularies),
                            [&](const VocabExpectation& v) { return name == v.name; }))
        << name << " is not in kVocabularies";
  }
  EXPECT_GT(found, 0u);
}

}  // namespace
}  // namespace kvllm
