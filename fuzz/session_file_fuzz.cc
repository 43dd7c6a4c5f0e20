// Fuzzes LoadSessionFile (it reads a path: the input goes to an in-memory file) and the
// DecodeBlock of each block it returns, as `kvllm chat --session` does. When the first byte is
// odd the input (past that byte) gets its XXH3 checksum fixed, so that the length checks
// behind the checksum are reached. A session that loads accounts for every byte of the file.
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kv/block_record.h"
#include "kv/session_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvllm;
  static fuzz::InputFile* file = new fuzz::InputFile;
  if (size == 0) return 0;
  std::vector<uint8_t> bytes(data + 1, data + size);
  if ((data[0] & 1) != 0 && bytes.size() >= 8) {
    const uint64_t sum = XXH3_64bits(bytes.data(), bytes.size() - 8);
    std::memcpy(bytes.data() + bytes.size() - 8, &sum, 8);  // little-endian host
  }
  StatusOr<SessionData> session = LoadSessionFile(file->Write(bytes.data(), bytes.size()));
  if (!session.ok()) {
    FUZZ_CHECK(!session.status().message().empty(), "an error without a message");
    return 0;
  }
  // magic, version, metadata length, metadata, block count, (length, block)..., checksum
  size_t accounted = 8 + 4 + 8 + session->metadata.size() + 4 + 8;
  for (const std::vector<uint8_t>& block : session->blocks) {
    accounted += 8 + block.size();
    (void)DecodeBlock(block);
  }
  FUZZ_CHECK(accounted == bytes.size(), "a loaded session does not account for its bytes");
  return 0;
}
