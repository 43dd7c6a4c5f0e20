// kvllm: a KV-cache-centred inference engine for Llama-family GGUF models.
#include <cstdio>
#include <vector>

#include <CLI/CLI.hpp>

#include "cli/commands.h"
#include "cli/common.h"

int main(int argc, char** argv) {
  using namespace kvllm::cli;
  CLI::App app("kvllm: LLM inference whose centre is the KV cache", "kvllm");
  app.require_subcommand(1);
  std::vector<std::pair<CLI::App*, Command>> commands;
  auto add = [&](Command (*reg)(CLI::App*)) {
    size_t before = app.get_subcommands({}).size();
    Command cmd = reg(&app);
    commands.emplace_back(app.get_subcommands({})[before], std::move(cmd));
  };
  add(RegisterRun);
  add(RegisterChat);
  add(RegisterPerplexity);
  add(RegisterInspect);
  add(RegisterBench);
  add(RegisterBenchServe);
  add(RegisterTokenize);
  add(RegisterKvSize);
  add(RegisterServe);

  std::vector<std::string> args;
  RewriteLlamaShortFlags(argc, argv, &args);
  std::vector<const char*> cargs;
  for (const std::string& a : args) cargs.push_back(a.c_str());
  try {
    app.parse(static_cast<int>(cargs.size()), cargs.data());
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  for (auto& [sub, cmd] : commands) {
    if (sub->parsed()) return cmd();
  }
  return 1;
}
