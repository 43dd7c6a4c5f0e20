// Strong id types for the KV cache's bookkeeping: a BlockId can never be passed where a SeqId
// is expected.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>

namespace kvllm {

template <typename Tag>
struct StrongId {
  int32_t value = -1;
  constexpr StrongId() = default;
  constexpr explicit StrongId(int32_t v) : value(v) {}
  constexpr bool valid() const { return value >= 0; }
  friend constexpr bool operator==(StrongId a, StrongId b) { return a.value == b.value; }
  friend constexpr auto operator<=>(StrongId a, StrongId b) { return a.value <=> b.value; }
};

using BlockId = StrongId<struct BlockIdTag>;
using SeqId = StrongId<struct SeqIdTag>;

}  // namespace kvllm

template <typename Tag>
struct std::hash<kvllm::StrongId<Tag>> {
  size_t operator()(kvllm::StrongId<Tag> id) const noexcept {
    return std::hash<int32_t>()(id.value);
  }
};
