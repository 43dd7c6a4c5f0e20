// Fuzzes DecodeBlock, the reader of KV blocks from the persistent tiers. Random bytes rarely
// carry a valid XXH3 checksum, so when the first byte is odd the input (past that byte) gets
// its checksum fixed and the decoder's length checks behind the checksum are reached. A
// record that decodes must encode back to exactly the same bytes.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kv/block_record.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvllm;
  if (size == 0) return 0;
  std::vector<uint8_t> bytes(data + 1, data + size);
  if ((data[0] & 1) != 0 && bytes.size() >= 8) {
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);  // little-endian host
  }
  StatusOr<BlockRecord> record = DecodeBlock(bytes);
  if (!record.ok()) {
    FUZZ_CHECK(!record.status().message().empty(), "an error without a message");
    return 0;
  }
  FUZZ_CHECK(record->tokens.size() == static_cast<size_t>(record->block_size), "tokens");
  FUZZ_CHECK(EncodeBlock(*record) == bytes, "EncodeBlock(DecodeBlock(bytes)) != bytes");
  BlockIdentity expected{record->model_identity, record->k_format, record->v_format,
                         record->block_size, record->data.size()};
  FUZZ_CHECK(CheckIdentity(*record, expected).ok(), "a record differs from its own identity");
  expected.data_bytes += 1;
  FUZZ_CHECK(!CheckIdentity(*record, expected).ok(), "CheckIdentity ignores the data size");
  return 0;
}
