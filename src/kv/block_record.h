// BlockRecord: one KV block as the persistent tiers (kv_store.h) hold it. A stored block
// carries its own identity, so a reader can refuse a block that is not what it asked for
// instead of trusting the key it was filed under.
//
// Encoding, little-endian, every size explicit (offsets in bytes):
//
//    0  8  magic "KVLLMBLK"
//    8  4  u32 format version (kBlockFormatVersion)
//   12  8  u64 hash             the block's chain hash (prefix_cache.h)
//   20  8  u64 parent           the parent block's chain hash, 0 for a first block
//   28  8  u64 model_identity   names the model (HashBytes of its header)
//   36  4  i32 block_size       tokens per block, 1..kMaxBlockSize
//   40  4  u32 k_len            length of k_format, 1..kMaxFormatName
//   44  4  u32 v_len            length of v_format, 1..kMaxFormatName
//   48  8  u64 data_len         length of data
//   56     k_format             [k_len] chars, KVFormat::name()
//          v_format             [v_len] chars
//          tokens               [block_size] i32
//          data                 [data_len] bytes, the block as it sits in the pool
//  end-8 8 u64 checksum         XXH3-64 of every byte before it
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "base/status.h"
#include "kv/prefix_cache.h"

namespace kvllm {

// 2: an f16 or Q8_0 K is stored dimension-major (KVFormat::dimension_major); version 1 blocks
// held it row by row.
inline constexpr uint32_t kBlockFormatVersion = 2;
inline constexpr int32_t kMaxBlockSize = 4096;
inline constexpr uint32_t kMaxFormatName = 64;

struct BlockRecord {
  BlockHash hash = 0;
  BlockHash parent = 0;
  uint64_t model_identity = 0;
  std::string k_format;  // KVFormat::name()
  std::string v_format;
  int32_t block_size = 0;
  std::vector<int32_t> tokens;  // [block_size] token ids
  std::vector<uint8_t> data;    // [KVLayout::bytes_per_block()]
};

// What a reader expects of every block it takes from a store.
struct BlockIdentity {
  uint64_t model_identity = 0;
  std::string k_format;
  std::string v_format;
  int32_t block_size = 0;
  size_t data_bytes = 0;
};

// Requires a record that DecodeBlock would accept (format names of 1..kMaxFormatName chars,
// block_size in 1..kMaxBlockSize, tokens.size() == block_size).
std::vector<uint8_t> EncodeBlock(const BlockRecord& record);

// Parses and validates bytes from a store: magic, version, every length against what is left,
// the checksum. Any other bytes (truncated, corrupt, from a later version) give an error,
// never a crash or a read past the span.
StatusOr<BlockRecord> DecodeBlock(std::span<const uint8_t> bytes);

// OK when `record` was written by the expected model, formats and block size and holds as
// many bytes as the pool's blocks; otherwise an error naming the first difference. The caller
// still compares record.hash and record.tokens with the block it looked up (a hash chain
// collision must be a miss, as in PrefixCache::Find).
Status CheckIdentity(const BlockRecord& record, const BlockIdentity& expected);

}  // namespace kvllm
