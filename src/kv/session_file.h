// SessionFile: a saved conversation on disk — metadata (JSON text: its tokens, the model and
// KV formats that computed it, whatever the caller adds) and the encoded KV blocks
// (block_record.h) of its full blocks.
//
//   "KVLLMSES" | u32 version | u64 metadata length | metadata | u32 block count |
//   (u64 length | encoded block) * count | u64 XXH3-64 of everything before it
//
// Saving is atomic (a temporary file, fsync, rename): a crash leaves the old session or the new
// one. Loading checks every length and the checksum; the blocks are checked again, one by one,
// when they are decoded.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "base/status.h"

namespace kvllm {

// 2: blocks hold an f16 or Q8_0 K dimension-major (see kBlockFormatVersion).
inline constexpr uint32_t kSessionFormatVersion = 2;

struct SessionData {
  std::string metadata;
  std::vector<std::vector<uint8_t>> blocks;
};

Status SaveSessionFile(const std::string& path, const SessionData& session);
// An error names the file and what is wrong with it (missing, truncated, corrupt, version).
StatusOr<SessionData> LoadSessionFile(const std::string& path);

}  // namespace kvllm
