// Sessions for the CLI (`kvllm chat --session`, `kvllm run --prompt-cache`): a sequence's
// tokens and the KV of its full blocks saved to a file (kv/session_file.h), and put back into
// the prefix cache of a later run, so that a prompt beginning with those tokens prefills only
// the rest. A session saved by another model, KV format or block size is refused.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "base/status.h"
#include "engine/engine.h"

namespace kvllm::cli {

struct RestoredSession {
  std::vector<int32_t> tokens;
  nlohmann::json extra;      // what the saver added (chat: messages and text)
  int32_t blocks = 0;        // KV blocks put into the prefix cache
};

// Saves `tokens` (the first `n_computed` of which have K/V in `seq`) with `extra`.
Status SaveSession(const std::string& path, const Engine& engine, SeqId seq,
                   const std::vector<int32_t>& tokens, int32_t n_computed,
                   const nlohmann::json& extra);
// nullopt when `path` does not exist (a new session); an error when it cannot be used.
StatusOr<std::optional<RestoredSession>> RestoreSession(const std::string& path, Engine& engine);

}  // namespace kvllm::cli
