// Fuzzes the KV cache's bookkeeping (KVCache over BlockPool and PrefixCache) with random
// operation sequences on a small pool, so that eviction under memory pressure, copy-on-write
// of shared partial blocks, prefix reuse and sliding-window release all happen often.
//
// Input: 3 configuration bytes (block size, number of blocks, mode: prefix cache on or off, or
// a sliding window with its 2 bytes), then operations of one opcode byte and a few argument
// bytes each (see Op). After every operation:
//   - KVCache::CheckIntegrity() is empty (ref counts = table entries + the cache's reference),
//   - free + cached-free + used == total, and used == the distinct blocks the tables hold,
//   - every live sequence holds exactly the positions the harness appended or attached.
// The harness writes K and V of each position as a function of the tokens up to it, so a
// read-back (kVerify, and at the end) checks that prefix hits and copy-on-write give every
// sequence its own tokens' K/V. At the end everything is freed: no block may stay used.
#include <array>
#include <cstddef>
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "fuzz/fuzz_support.h"
#include "kv/block_record.h"
#include "kv/kv_cache.h"

namespace kvllm::fuzz {
namespace {

constexpr int32_t kHeadDim = 32;
constexpr int32_t kMaxSeqs = 8;
constexpr int32_t kAlphabet = 3;  // few distinct tokens, so that prefixes repeat

enum Op : uint8_t {
  kAppend,             // seq, n: CanAppend, then Append and write K/V of the new positions
  kFree,               // seq
  kFork,               // src, dst
  kCacheFullBlocks,    // seq, n: index the full blocks among the first n positions
  kAttachPrefix,       // seq, history, length, extra, max: look a known prefix up
  kReleaseWindow,      // seq
  kExportImport,       // seq, corrupt: export, encode, decode and import the full blocks
  kVerify,             // read back every live position
  kNumOps,
};

class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), end_(data + size) {}
  bool empty() const { return p_ == end_; }
  uint8_t Byte() { return p_ == end_ ? 0 : *p_++; }

 private:
  const uint8_t* p_;
  const uint8_t* end_;
};

// K (and V) row of the token at `pos`: values f16 holds exactly, derived from every token up
// to and including `pos`, so two positions get equal rows only with equal prefixes.
std::array<float, kHeadDim> ExpectedRow(const std::vector<int32_t>& tokens, int32_t pos) {
  uint32_t h = 2166136261u;
  for (int32_t i = 0; i <= pos; ++i) h = (h ^ static_cast<uint32_t>(tokens[i])) * 16777619u;
  std::array<float, kHeadDim> row{};
  row[0] = static_cast<float>(h % 2048);
  row[1] = static_cast<float>((h >> 11) % 2048);
  row[2] = static_cast<float>(pos % 2048);
  row[3] = static_cast<float>(tokens[pos]);
  return row;
}

class Harness {
 public:
  Harness(KVLayout layout, int32_t num_blocks, KVWindow window, bool prefix)
      : kv_(layout, num_blocks, window) {
    if (prefix) kv_.EnablePrefixCache(/*identity=*/42);
  }

  void Run(Input& in) {
    for (int step = 0; !in.empty() && step < 256; ++step) {
      const uint8_t op = in.Byte() % kNumOps;
      switch (op) {
        case kAppend: Append(SeqId(in.Byte() % kMaxSeqs), in.Byte(), in); break;
        case kFree: Free(SeqId(in.Byte() % kMaxSeqs)); break;
        case kFork: Fork(SeqId(in.Byte() % kMaxSeqs), SeqId(in.Byte() % kMaxSeqs)); break;
        case kCacheFullBlocks: CacheFullBlocks(SeqId(in.Byte() % kMaxSeqs), in.Byte()); break;
        case kAttachPrefix: AttachPrefix(in); break;
        case kReleaseWindow: ReleaseWindow(SeqId(in.Byte() % kMaxSeqs)); break;
        case kExportImport: ExportImport(SeqId(in.Byte() % kMaxSeqs), in.Byte()); break;
        case kVerify: VerifyData(); break;
      }
      Check("after op " + std::to_string(op) + " at step " + std::to_string(step));
    }
    VerifyData();
    for (int32_t s = 0; s < kMaxSeqs; ++s) Free(SeqId(s));
    Check("after freeing everything");
    const KVStats st = kv_.Stats();
    FUZZ_CHECK(st.blocks_used == 0, "blocks leaked: " + std::to_string(st.blocks_used));
    FUZZ_CHECK(st.blocks_free + st.blocks_cached_free == st.blocks_total, "blocks leaked");
    if (!kv_.prefix_cache_enabled()) FUZZ_CHECK(st.blocks_cached_free == 0, "cached blocks");
  }

 private:
  void Append(SeqId seq, uint8_t n_byte, Input& in) {
    const int32_t n = n_byte % (3 * kv_.block_size() + 1);
    if (!kv_.CanAppend(seq, n)) {
      FUZZ_CHECK(kv_.BlocksNeeded(seq, n) > kv_.available_blocks(), "CanAppend refused");
      return;
    }
    std::vector<int32_t>& tokens = seqs_[seq.value];
    kv_.Append(seq, n);
    const int32_t begin = static_cast<int32_t>(tokens.size());
    for (int32_t i = 0; i < n; ++i) tokens.push_back(in.Byte() % kAlphabet);
    for (int32_t pos = begin; pos < begin + n; ++pos) {
      const std::array<float, kHeadDim> row = ExpectedRow(tokens, pos);
      kv_.WriteK(seq, /*layer=*/0, pos, row.data());
      kv_.WriteV(seq, /*layer=*/0, pos, row.data());
    }
  }

  void Free(SeqId seq) {
    auto it = seqs_.find(seq.value);
    if (it != seqs_.end()) {
      Remember(it->second);
      seqs_.erase(it);
    }
    kv_.Free(seq);
  }

  void Fork(SeqId src, SeqId dst) {
    if (!kv_.Has(src) || kv_.Has(dst)) return;
    kv_.Fork(src, dst);
    seqs_[dst.value] = seqs_[src.value];
  }

  void CacheFullBlocks(SeqId seq, uint8_t n_byte) {
    if (!kv_.Has(seq)) return;
    const std::vector<int32_t>& tokens = seqs_[seq.value];
    const size_t n = n_byte % (tokens.size() + 1);
    kv_.CacheFullBlocks(seq, std::span<const int32_t>(tokens.data(), n));
  }

  void AttachPrefix(Input& in) {
    const SeqId seq(in.Byte() % kMaxSeqs);
    const uint8_t history = in.Byte(), length = in.Byte(), extra = in.Byte(), max = in.Byte();
    if (kv_.Has(seq)) return;
    std::vector<int32_t> tokens;
    if (!histories_.empty()) {
      const std::vector<int32_t>& h = histories_[history % histories_.size()];
      tokens.assign(h.begin(), h.begin() + length % (h.size() + 1));
    }
    for (int i = 0; i < extra % 4; ++i) tokens.push_back(in.Byte() % kAlphabet);
    const int32_t max_tokens = max % (static_cast<int32_t>(tokens.size()) + 2);
    const PrefixMatch match = kv_.AttachPrefix(seq, tokens, max_tokens);
    const int32_t bs = kv_.block_size();
    FUZZ_CHECK(match.tokens % bs == 0 && match.tokens <= max_tokens &&
                   match.tokens <= static_cast<int32_t>(tokens.size()),
               "prefix match of " + std::to_string(match.tokens) + " tokens");
    if (!kv_.prefix_cache_enabled()) {
      FUZZ_CHECK(match.tokens == 0 && match.miss == PrefixMiss::kDisabled, "disabled cache hit");
    }
    FUZZ_CHECK(kv_.Table(seq).num_tokens == match.tokens, "attached table length");
    tokens.resize(match.tokens);
    seqs_[seq.value] = tokens;
  }

  void ReleaseWindow(SeqId seq) {
    if (!kv_.Has(seq)) return;
    kv_.ReleaseOutsideWindow(seq, kv_.Table(seq).num_tokens);
  }

  void ExportImport(SeqId seq, uint8_t corrupt) {
    if (!kv_.Has(seq)) return;
    const std::vector<int32_t>& tokens = seqs_[seq.value];
    std::vector<BlockRecord> records = kv_.ExportBlocks(seq, tokens);
    if (!kv_.prefix_cache_enabled()) FUZZ_CHECK(records.empty(), "export without a cache");
    for (BlockRecord& r : records) {
      StatusOr<BlockRecord> back = DecodeBlock(EncodeBlock(r));
      FUZZ_CHECK(back.ok(), back.status().message());
      FUZZ_CHECK(back->hash == r.hash && back->parent == r.parent && back->tokens == r.tokens &&
                     back->data == r.data && CheckIdentity(*back, kv_.block_identity()).ok(),
                 "block record round trip");
      r = std::move(*back);
    }
    size_t limit = records.size();
    if ((corrupt & 1) != 0 && !records.empty()) {  // a record that is not what it claims
      limit = (corrupt >> 1) % records.size();
      records[limit].tokens[0] ^= 1;
    }
    const int32_t imported = kv_.ImportBlocks(records);
    FUZZ_CHECK(imported >= 0 && static_cast<size_t>(imported) <= limit,
               "imported " + std::to_string(imported) + " of " + std::to_string(limit));
  }

  void VerifyData() {
    std::array<float, kHeadDim> got;
    for (const auto& [s, tokens] : seqs_) {
      const SeqId seq(s);
      const BlockTable& t = kv_.Table(seq);
      for (int32_t pos = 0; pos < t.num_tokens; ++pos) {
        if (!t.blocks[pos / kv_.block_size()].valid()) continue;  // released by the window
        const std::array<float, kHeadDim> want = ExpectedRow(tokens, pos);
        kv_.ReadK(seq, 0, 0, pos, got.data());
        FUZZ_CHECK(got == want, "K of sequence " + std::to_string(s) + " at " +
                                    std::to_string(pos) + " is another prefix's");
        kv_.ReadV(seq, 0, 0, pos, got.data());
        FUZZ_CHECK(got == want, "V of sequence " + std::to_string(s) + " at " +
                                    std::to_string(pos) + " is another prefix's");
      }
    }
  }

  void Check(const std::string& when) {
    const std::string problem = kv_.CheckIntegrity();
    FUZZ_CHECK(problem.empty(), when + ": " + problem);
    const KVStats st = kv_.Stats();
    FUZZ_CHECK(st.blocks_free + st.blocks_cached_free + st.blocks_used == st.blocks_total,
               when + ": free + cached-free + used != total");
    FUZZ_CHECK(st.blocks_used == kv_.blocks_used(), when + ": blocks_used()");
    std::set<int32_t> held;
    for (const auto& [s, tokens] : seqs_) {
      FUZZ_CHECK(kv_.Has(SeqId(s)), when + ": sequence " + std::to_string(s) + " lost");
      const BlockTable& t = kv_.Table(SeqId(s));
      FUZZ_CHECK(t.num_tokens == static_cast<int32_t>(tokens.size()),
                 when + ": sequence " + std::to_string(s) + " has " +
                     std::to_string(t.num_tokens) + " positions, not " +
                     std::to_string(tokens.size()));
      for (BlockId id : t.blocks) {
        if (id.valid()) held.insert(id.value);
      }
    }
    FUZZ_CHECK(static_cast<int32_t>(held.size()) == st.blocks_used,
               when + ": " + std::to_string(st.blocks_used) + " blocks used, tables hold " +
                   std::to_string(held.size()));
  }

  void Remember(const std::vector<int32_t>& tokens) {
    if (tokens.empty()) return;
    if (histories_.size() == 8) histories_.erase(histories_.begin());
    histories_.push_back(tokens);
  }

  KVCache kv_;
  std::map<int32_t, std::vector<int32_t>> seqs_;  // live sequences: the token of each position
  std::vector<std::vector<int32_t>> histories_;   // freed sequences' tokens, to look up again
};

}  // namespace
}  // namespace kvllm::fuzz

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace kvllm;
  fuzz::Input in(data, size);
  constexpr int32_t kBlockSizes[] = {1, 2, 3, 4, 8, 16};
  const int32_t block_size = kBlockSizes[in.Byte() % std::size(kBlockSizes)];
  const int32_t num_blocks = 1 + in.Byte() % 16;
  const uint8_t mode = in.Byte() % 4;
  KVWindow window;
  if (mode == 3) {
    window.window = 1 + in.Byte() % 40;
    window.sinks = in.Byte() % 8;
  }
  StatusOr<KVLayout> layout =
      KVLayout::Make(KVShape{.n_layer = 1, .n_kv_head = 1, .head_dim = fuzz::kHeadDim},
                     block_size, DType::kF16, DType::kF16);
  FUZZ_CHECK(layout.ok(), layout.status().message());
  fuzz::Harness harness(*layout, num_blocks, window, /*prefix=*/mode <= 1);
  harness.Run(in);
  return 0;
}
