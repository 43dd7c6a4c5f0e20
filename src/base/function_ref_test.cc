#include "base/function_ref.h"

#include <gtest/gtest.h>

#include <array>
#include <string>

namespace kvllm {
namespace {

int Apply(FunctionRef<int(int, int)> f, int a, int b) { return f(a, b); }

TEST(FunctionRefTest, CallsTheLambdaItRefersToWithItsArguments) {
  const std::array<int, 8> big{1, 2, 3, 4, 5, 6, 7, 8};  // a capture std::function would box
  EXPECT_EQ(Apply([big](int a, int b) { return big[7] * a - b; }, 3, 4), 20);
}

TEST(FunctionRefTest, RefersToTheCallableItselfNotACopy) {
  int calls = 0;
  auto count = [&calls](int a, int) { return calls += a; };
  FunctionRef<int(int, int)> ref(count);
  ref(2, 0);
  ref(3, 0);
  EXPECT_EQ(calls, 5);
  struct Counter {
    int n = 0;
    int operator()(int a, int b) { return n += a + b; }
  } counter;
  EXPECT_EQ(Apply(counter, 1, 2), 3);
  EXPECT_EQ(Apply(counter, 1, 2), 6);  // the same object both times
  EXPECT_EQ(counter.n, 6);
}

TEST(FunctionRefTest, ConvertsTheResultAndForwardsReferences) {
  std::string s = "kv";
  auto add_llm = [](std::string& x) { x += "llm"; };
  FunctionRef<void(std::string&)> append(add_llm);
  append(s);
  EXPECT_EQ(s, "kvllm");
  auto halve = [](int x) { return x / 2.0f; };
  FunctionRef<double(int)> half(halve);  // float to double
  EXPECT_EQ(half(3), 1.5);
}

}  // namespace
}  // namespace kvllm
