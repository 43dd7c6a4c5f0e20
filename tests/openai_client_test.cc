// The official `openai` npm client against `kvllm serve` (tests/openai_client.cjs). The package
// is installed from the npm registry by scripts/fetch-npm-openai.sh; offline, the test skips.
#include <gtest/gtest.h>

#include <fstream>
#include <sstream>

#include "server_process.h"
#include "test_support.h"

namespace kvllm {
namespace {

TEST(OpenAiClientTest, OfficialClientWorksAgainstServe) {
  const std::string dir = testing::BinaryDir() + "/npm-openai";
  std::string out, err;
  ASSERT_EQ(testing::RunCommand("bash " + testing::SourceDir() + "/scripts/fetch-npm-openai.sh " +
                                    dir, &out, &err), 0) << out << err;
  std::ifstream skip(dir + "/SKIP");
  if (skip) {
    std::stringstream reason;
    reason << skip.rdbuf();
    GTEST_SKIP() << reason.str();
  }
  testing::ServerProcess s("-m " + testing::SourceDir() + "/models/kvllm-prose.gguf -t 2");
  ASSERT_TRUE(s.ok()) << s.log();
  const int status = testing::RunCommand("NODE_PATH=" + dir + "/node_modules node " +
                                             testing::SourceDir() + "/tests/openai_client.cjs " +
                                             s.url(), &out, &err);
  EXPECT_EQ(status, 0) << out << err << "\nserver log:\n" << s.log();
  EXPECT_NE(out.find("\"ok\":true"), std::string::npos) << out;
  EXPECT_EQ(s.Stop(), 0);
}

}  // namespace
}  // namespace kvllm
