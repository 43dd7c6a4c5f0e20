#include "kv/block_record.h"

#include <xxhash.h>

#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace kvllm {
namespace {

constexpr char kMagic[8] = {'K', 'V', 'L', 'L', 'M', 'B', 'L', 'K'};
constexpr size_t kHeaderBytes = 56;  // up to the first variable-length field
constexpr size_t kChecksumBytes = 8;

// Writes the low n_bytes of v at *w and advances it.
void PutLE(uint8_t*& w, uint64_t v, int n_bytes) {
  for (int i = 0; i < n_bytes; ++i) *w++ = static_cast<uint8_t>(v >> (8 * i));
}

void PutBytes(uint8_t*& w, const void* src, size_t n) {
  if (n != 0) std::memcpy(w, src, n);
  w += n;
}

uint64_t GetLE(const uint8_t* p, int n_bytes) {
  uint64_t v = 0;
  for (int i = 0; i < n_bytes; ++i) v |= uint64_t{p[i]} << (8 * i);
  return v;
}

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "0x%016" PRIx64, v);
  return buf;
}

// A format name is printable ASCII, so that error messages can quote it.
bool Printable(std::span<const uint8_t> name) {
  for (uint8_t c : name) {
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

}  // namespace

std::vector<uint8_t> EncodeBlock(const BlockRecord& record) {
  KVLLM_CHECK(record.block_size >= 1 && record.block_size <= kMaxBlockSize);
  KVLLM_CHECK(record.tokens.size() == static_cast<size_t>(record.block_size));
  KVLLM_CHECK(!record.k_format.empty() && record.k_format.size() <= kMaxFormatName);
  KVLLM_CHECK(!record.v_format.empty() && record.v_format.size() <= kMaxFormatName);
  std::vector<uint8_t> out(kHeaderBytes + record.k_format.size() + record.v_format.size() +
                           record.tokens.size() * 4 + record.data.size() + kChecksumBytes);
  uint8_t* w = out.data();
  PutBytes(w, kMagic, sizeof kMagic);
  PutLE(w, kBlockFormatVersion, 4);
  PutLE(w, record.hash, 8);
  PutLE(w, record.parent, 8);
  PutLE(w, record.model_identity, 8);
  PutLE(w, static_cast<uint32_t>(record.block_size), 4);
  PutLE(w, record.k_format.size(), 4);
  PutLE(w, record.v_format.size(), 4);
  PutLE(w, record.data.size(), 8);
  PutBytes(w, record.k_format.data(), record.k_format.size());
  PutBytes(w, record.v_format.data(), record.v_format.size());
  for (int32_t t : record.tokens) PutLE(w, static_cast<uint32_t>(t), 4);
  PutBytes(w, record.data.data(), record.data.size());
  PutLE(w, XXH3_64bits(out.data(), out.size() - kChecksumBytes), 8);
  return out;
}

StatusOr<BlockRecord> DecodeBlock(std::span<const uint8_t> bytes) {
  const size_t size = bytes.size();
  if (size < kHeaderBytes + kChecksumBytes) {
    return Status::Error("KV block record truncated: " + std::to_string(size) +
                         " bytes, a record has at least " +
                         std::to_string(kHeaderBytes + kChecksumBytes));
  }
  const uint8_t* p = bytes.data();
  if (std::memcmp(p, kMagic, sizeof kMagic) != 0) {
    return Status::Error("not a KV block record (bad magic)");
  }
  const uint32_t version = static_cast<uint32_t>(GetLE(p + 8, 4));
  if (version != kBlockFormatVersion) {
    return Status::Error("KV block record version " + std::to_string(version) +
                         ", this build reads version " + std::to_string(kBlockFormatVersion));
  }
  const size_t body = size - kChecksumBytes;
  if (XXH3_64bits(p, body) != GetLE(p + body, 8)) {
    return Status::Error("KV block record corrupt (checksum mismatch)");
  }

  // The checksum only catches accidents: the lengths are still checked one by one against
  // what is left, so that a crafted record cannot make us read past the span.
  BlockRecord r;
  r.hash = GetLE(p + 12, 8);
  r.parent = GetLE(p + 20, 8);
  r.model_identity = GetLE(p + 28, 8);
  r.block_size = static_cast<int32_t>(GetLE(p + 36, 4));
  const uint64_t k_len = GetLE(p + 40, 4);
  const uint64_t v_len = GetLE(p + 44, 4);
  const uint64_t data_len = GetLE(p + 48, 8);
  if (r.block_size < 1 || r.block_size > kMaxBlockSize) {
    return Status::Error("KV block record has block size " + std::to_string(r.block_size) +
                         ", outside 1.." + std::to_string(kMaxBlockSize));
  }
  if (k_len < 1 || k_len > kMaxFormatName || v_len < 1 || v_len > kMaxFormatName) {
    return Status::Error("KV block record has a format name of bad length (" +
                         std::to_string(k_len) + ", " + std::to_string(v_len) + ")");
  }
  const uint64_t tokens_len = uint64_t{4} * static_cast<uint32_t>(r.block_size);
  uint64_t left = body - kHeaderBytes;
  for (uint64_t len : {k_len, v_len, tokens_len}) {
    if (len > left) {
      return Status::Error("KV block record too short for its format names and tokens");
    }
    left -= len;
  }
  if (data_len != left) {
    return Status::Error("KV block record length mismatch: header says " +
                         std::to_string(data_len) + " data bytes, " + std::to_string(left) +
                         " are there");
  }

  size_t pos = kHeaderBytes;
  const auto k_name = bytes.subspan(pos, k_len);
  const auto v_name = bytes.subspan(pos + k_len, v_len);
  if (!Printable(k_name) || !Printable(v_name)) {
    return Status::Error("KV block record has a format name that is not printable ASCII");
  }
  r.k_format.assign(k_name.begin(), k_name.end());
  r.v_format.assign(v_name.begin(), v_name.end());
  pos += k_len + v_len;
  r.tokens.resize(r.block_size);
  for (int32_t& t : r.tokens) {
    t = static_cast<int32_t>(GetLE(p + pos, 4));
    pos += 4;
  }
  r.data.assign(p + pos, p + pos + data_len);
  return r;
}

Status CheckIdentity(const BlockRecord& record, const BlockIdentity& expected) {
  if (record.model_identity != expected.model_identity) {
    return Status::Error("KV block from another model (identity " + Hex(record.model_identity) +
                         ", expected " + Hex(expected.model_identity) + ")");
  }
  if (record.k_format != expected.k_format) {
    return Status::Error("KV block has K format " + record.k_format + ", expected " +
                         expected.k_format);
  }
  if (record.v_format != expected.v_format) {
    return Status::Error("KV block has V format " + record.v_format + ", expected " +
                         expected.v_format);
  }
  if (record.block_size != expected.block_size) {
    return Status::Error("KV block has block size " + std::to_string(record.block_size) +
                         ", expected " + std::to_string(expected.block_size));
  }
  if (record.data.size() != expected.data_bytes) {
    return Status::Error("KV block has " + std::to_string(record.data.size()) +
                         " data bytes, expected " + std::to_string(expected.data_bytes));
  }
  return Status::Ok();
}

}  // namespace kvllm
