#include "test_support.h"

#include <sys/wait.h>
#include <unistd.h>

#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include <nlohmann/json.hpp>

namespace kvllm::testing {

std::string SourceDir() { return KVLLM_SOURCE_DIR; }

std::string BinaryDir() { return KVLLM_BINARY_DIR; }

int RunCommand(const std::string& cmd, std::string* out, std::string* err) {
  std::string err_file;
  std::string full = cmd;
  if (err != nullptr) {
    err_file = BinaryDir() + "/test-stderr-" + std::to_string(getpid()) + ".txt";
    full += " 2>" + err_file;
  }
  FILE* p = popen(full.c_str(), "r");
  if (p == nullptr) throw std::runtime_error("popen failed: " + cmd);
  std::string data;
  char buf[65536];
  size_t n;
  while ((n = fread(buf, 1, sizeof(buf), p)) > 0) data.append(buf, n);
  int status = pclose(p);
  if (out != nullptr) *out = std::move(data);
  if (err != nullptr) {
    std::ifstream in(err_file);
    std::stringstream ss;
    ss << in.rdbuf();
    *err = ss.str();
    std::filesystem::remove(err_file);
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

std::string TinyModel() { return TestModel("tiny-f32-s7", "--preset tiny --type f32 --seed 7"); }

std::string KvllmBinary() { return BinaryDir() + "/kvllm"; }

std::string TestModel(const std::string& name, const std::string& args) {
  const std::string dir = BinaryDir() + "/test-models";
  const std::string path = dir + "/" + name + ".gguf";
  if (std::filesystem::exists(path)) return path;
  std::filesystem::create_directories(dir);
  const std::string tmp = path + ".tmp." + std::to_string(getpid());
  std::string out, err;
  const std::string cmd = "/usr/bin/python3 " + SourceDir() + "/tools/make_model.py " + args +
                          " --out " + tmp;
  if (RunCommand(cmd, &out, &err) != 0) {
    throw std::runtime_error("make_model.py failed: " + cmd + "\n" + err);
  }
  std::filesystem::rename(tmp, path);
  return path;
}

std::vector<std::vector<double>> ReferenceLogits(const std::string& model,
                                                 const std::vector<int>& tokens) {
  std::string list;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (i > 0) list += ',';
    list += std::to_string(tokens[i]);
  }
  std::string out, err;
  const std::string cmd = "/usr/bin/python3 " + SourceDir() + "/tools/reference.py " + model +
                          " --all --tokens " + list;
  if (RunCommand(cmd, &out, &err) != 0) {
    throw std::runtime_error("reference.py failed: " + cmd + "\n" + err);
  }
  auto j = nlohmann::json::parse(out);
  return j.at("logits").get<std::vector<std::vector<double>>>();
}

double RelativeError(const float* a, const std::vector<double>& b) {
  double max_diff = 0, max_ref = 0;
  for (size_t i = 0; i < b.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(a[i] - b[i]));
    max_ref = std::max(max_ref, std::abs(b[i]));
  }
  return max_ref > 0 ? max_diff / max_ref : max_diff;
}

double RelativeError(const std::vector<float>& a, const std::vector<float>& b) {
  return RelativeError(a.data(), std::vector<double>(b.begin(), b.end()));
}

}  // namespace kvllm::testing
