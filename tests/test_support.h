// Helpers for the cross-module tests: models written by tools/make_model.py (cached under the
// build folder) and the independent numpy reference forward (tools/reference.py).
#pragma once

#include <string>
#include <vector>

namespace kvllm::testing {

std::string SourceDir();  // the checkout
std::string BinaryDir();  // the build folder (holds the kvllm binary)

// Path of a model written with `make_model.py <args>`; written once per build folder (the file
// name `name` must identify the arguments). Concurrent test processes are safe: the file is
// written under a temporary name and renamed.
std::string TestModel(const std::string& name, const std::string& args);
// The model most tests share: make_model.py --preset tiny --type f32 --seed 7 (context 512,
// vocabulary 512).
std::string TinyModel();
// The kvllm binary of this build.
std::string KvllmBinary();

// Runs a command, returns its exit status and stdout (stderr goes to `err` when given).
int RunCommand(const std::string& cmd, std::string* out, std::string* err = nullptr);

// Logits of every position of `tokens` from tools/reference.py (float64 numpy forward).
std::vector<std::vector<double>> ReferenceLogits(const std::string& model,
                                                 const std::vector<int>& tokens);

// max |a - b| / max |b|: the error measure the tests state their tolerances in.
double RelativeError(const float* a, const std::vector<double>& b);
double RelativeError(const std::vector<float>& a, const std::vector<float>& b);

}  // namespace kvllm::testing
