// The kvllm sub-commands. Each registers its flags on a CLI11 sub-app and returns the
// function that runs it (exit status).
#pragma once

#include <functional>

#include <CLI/CLI.hpp>

namespace kvllm::cli {

using Command = std::function<int()>;

Command RegisterRun(CLI::App* app);
Command RegisterInspect(CLI::App* app);
Command RegisterBench(CLI::App* app);
Command RegisterBenchServe(CLI::App* app);
Command RegisterTokenize(CLI::App* app);
Command RegisterChat(CLI::App* app);
Command RegisterPerplexity(CLI::App* app);
Command RegisterKvSize(CLI::App* app);
Command RegisterServe(CLI::App* app);

}  // namespace kvllm::cli
