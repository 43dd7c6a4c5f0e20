// KVStore: a persistent tier below the in-memory prefix cache (disk, Redis), keyed by the
// block's chain hash (prefix_cache.h). A store keeps opaque bytes: callers put what
// EncodeBlock made and check what they get back with DecodeBlock and CheckIdentity
// (block_record.h), so a corrupt, foreign or colliding entry is recomputed, never used.
//
// Errors mean the tier itself failed (a disk error, Redis down); a block that is simply not
// there is a miss. A caller may treat any error as a miss and go on.
//
// Thread-safety: every implementation may be called from several threads at once (the
// engine thread looks up while a background writer puts).
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "base/status.h"
#include "kv/prefix_cache.h"

namespace kvllm {

class KVStore {
 public:
  virtual ~KVStore() = default;

  // "disk", "redis": for logs and metrics.
  virtual const char* name() const = 0;
  // The bytes stored under `hash`, nullopt on a miss.
  virtual StatusOr<std::optional<std::vector<uint8_t>>> Get(BlockHash hash) = 0;
  // Stores `encoded` under `hash`, replacing any entry: readers see the old or the new bytes,
  // never a mix.
  virtual Status Put(BlockHash hash, std::span<const uint8_t> encoded) = 0;
  // Removing an absent entry is OK.
  virtual Status Remove(BlockHash hash) = 0;
  // A cheap hint (no error channel): false when unsure, e.g. while the tier is down.
  virtual bool Contains(BlockHash hash) = 0;
};

}  // namespace kvllm
