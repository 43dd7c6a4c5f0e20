#include "kv/block_record.h"

#include <gtest/gtest.h>

#include <random>
#include <vector>

namespace kvllm {
namespace {

BlockRecord SampleRecord() {
  BlockRecord r;
  r.parent = 0x1122334455667788;
  r.model_identity = 0xabcdef;
  r.k_format = "q4_0r";
  r.v_format = "f16";
  r.block_size = 16;
  for (int32_t i = 0; i < r.block_size; ++i) r.tokens.push_back(1000 + i * 7);
  r.tokens[3] = -5;  // negative ids survive the unsigned encoding
  r.hash = HashBlock(r.parent, r.model_identity, r.tokens);
  for (int i = 0; i < 300; ++i) r.data.push_back(static_cast<uint8_t>(i * 31));
  return r;
}

BlockIdentity IdentityOf(const BlockRecord& r) {
  return {r.model_identity, r.k_format, r.v_format, r.block_size, r.data.size()};
}

// Recomputes the trailing checksum after an edit, to reach the checks behind it.
void Reseal(std::vector<uint8_t>& bytes) {
  const uint64_t sum = HashBytes(std::span(bytes).first(bytes.size() - 8));
  for (int i = 0; i < 8; ++i) bytes[bytes.size() - 8 + i] = static_cast<uint8_t>(sum >> (8 * i));
}

void SetLE32(std::vector<uint8_t>& bytes, size_t offset, uint32_t v) {
  for (int i = 0; i < 4; ++i) bytes[offset + i] = static_cast<uint8_t>(v >> (8 * i));
}

TEST(BlockRecordTest, RoundTrip) {
  const BlockRecord r = SampleRecord();
  const std::vector<uint8_t> bytes = EncodeBlock(r);
  EXPECT_EQ(bytes.size(), 56 + 5 + 3 + 16 * 4 + 300 + 8);
  EXPECT_EQ(std::string(bytes.begin(), bytes.begin() + 8), "KVLLMBLK");
  auto decoded = DecodeBlock(bytes);
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_EQ(decoded->hash, r.hash);
  EXPECT_EQ(decoded->parent, r.parent);
  EXPECT_EQ(decoded->model_identity, r.model_identity);
  EXPECT_EQ(decoded->k_format, r.k_format);
  EXPECT_EQ(decoded->v_format, r.v_format);
  EXPECT_EQ(decoded->block_size, r.block_size);
  EXPECT_EQ(decoded->tokens, r.tokens);
  EXPECT_EQ(decoded->data, r.data);
  EXPECT_TRUE(CheckIdentity(*decoded, IdentityOf(r)).ok());
}

TEST(BlockRecordTest, EmptyDataRoundTrips) {
  BlockRecord r = SampleRecord();
  r.data.clear();
  auto decoded = DecodeBlock(EncodeBlock(r));
  ASSERT_TRUE(decoded.ok()) << decoded.status().message();
  EXPECT_TRUE(decoded->data.empty());
}

TEST(BlockRecordTest, EveryTruncationIsAnError) {
  const std::vector<uint8_t> bytes = EncodeBlock(SampleRecord());
  for (size_t n = 0; n < bytes.size(); ++n) {
    // An exact-size copy, so that AddressSanitizer sees any read past the end.
    const std::vector<uint8_t> cut(bytes.begin(), bytes.begin() + n);
    EXPECT_FALSE(DecodeBlock(cut).ok()) << "length " << n;
  }
  std::vector<uint8_t> longer = bytes;
  longer.push_back(0);
  EXPECT_FALSE(DecodeBlock(longer).ok());
}

TEST(BlockRecordTest, EverySingleByteMutationIsAnError) {
  const std::vector<uint8_t> bytes = EncodeBlock(SampleRecord());
  std::mt19937 rng(1234);
  std::uniform_int_distribution<size_t> where(0, bytes.size() - 1);
  std::uniform_int_distribution<int> flip(1, 255);  // never 0: the byte always changes
  for (int i = 0; i < 4000; ++i) {
    std::vector<uint8_t> bad = bytes;
    const size_t at = where(rng);
    bad[at] ^= static_cast<uint8_t>(flip(rng));
    EXPECT_FALSE(DecodeBlock(bad).ok()) << "byte " << at;
  }
}

TEST(BlockRecordTest, NamesWhatIsWrong) {
  const std::vector<uint8_t> good = EncodeBlock(SampleRecord());
  auto error = [](std::vector<uint8_t> bytes) { return DecodeBlock(bytes).status().message(); };

  std::vector<uint8_t> b = good;
  b[0] = 'X';
  EXPECT_NE(error(b).find("magic"), std::string::npos);
  b = good;
  SetLE32(b, 8, kBlockFormatVersion + 1);
  EXPECT_NE(error(b).find("version " + std::to_string(kBlockFormatVersion + 1)),
            std::string::npos);
  SetLE32(b, 8, 1);  // an f16 K held row by row: not to be read as dimension-major
  EXPECT_NE(error(b).find("version 1"), std::string::npos);
  b = good;
  b[100] ^= 1;
  EXPECT_NE(error(b).find("checksum"), std::string::npos);
}

// Records whose checksum is right but whose fields lie: the length checks stand alone.
TEST(BlockRecordTest, ResealedLiesAreErrors) {
  const std::vector<uint8_t> good = EncodeBlock(SampleRecord());
  struct Lie {
    size_t offset;
    uint32_t value;
    const char* expect;
  };
  const Lie lies[] = {
      {36, 0, "block size 0"},
      {36, 4097, "block size 4097"},
      {36, 0x80000000u, "block size"},
      {36, 4096, "too short"},  // tokens no longer fit
      {36, 15, "length mismatch"},
      {40, 0, "format name"},
      {40, 0xffffffffu, "format name"},
      {44, 65, "format name"},
      {48, 301, "length mismatch"},
      {48, 299, "length mismatch"},
      {52, 1, "length mismatch"},  // data_len's high word: 2^32 + 300
  };
  for (const Lie& lie : lies) {
    std::vector<uint8_t> b = good;
    SetLE32(b, lie.offset, lie.value);
    Reseal(b);
    const auto decoded = DecodeBlock(b);
    ASSERT_FALSE(decoded.ok()) << lie.offset << "=" << lie.value;
    EXPECT_NE(decoded.status().message().find(lie.expect), std::string::npos)
        << decoded.status().message();
  }
  std::vector<uint8_t> b = good;
  b[56] = '\n';  // a control character in the K format name
  Reseal(b);
  EXPECT_FALSE(DecodeBlock(b).ok());
}

TEST(BlockRecordTest, CheckIdentityRefusesAnotherModelFormatOrSize) {
  const BlockRecord r = SampleRecord();
  struct Case {
    void (*edit)(BlockIdentity&);
    const char* expect;
  };
  const Case cases[] = {
      {[](BlockIdentity& e) { e.model_identity = 1; }, "another model"},
      {[](BlockIdentity& e) { e.k_format = "q8_0"; }, "K format q4_0r, expected q8_0"},
      {[](BlockIdentity& e) { e.v_format = "bf16"; }, "V format f16, expected bf16"},
      {[](BlockIdentity& e) { e.block_size = 32; }, "block size 16, expected 32"},
      {[](BlockIdentity& e) { e.data_bytes = 299; }, "300 data bytes, expected 299"},
  };
  for (const Case& c : cases) {
    BlockIdentity expected = IdentityOf(r);
    c.edit(expected);
    const Status s = CheckIdentity(r, expected);
    ASSERT_FALSE(s.ok());
    EXPECT_NE(s.message().find(c.expect), std::string::npos) << s.message();
  }
}

}  // namespace
}  // namespace kvllm
