// Writes the binary seeds of fuzz/corpus/ (run it from the fuzz build: make_seeds fuzz/corpus):
// stored KV blocks, session files, a minimal GGUF with every kind of metadata value, and a few
// KV cache operation sequences. Each seed starts with the byte its fuzz target reads first.
// The text seeds (requests, tokenizer inputs) are written by hand; corpus/gguf/tiny.gguf is
// tools/make_model.py's smallest model (see docs/reliability.md).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include "kv/block_record.h"
#include "kv/session_file.h"

namespace {

using Bytes = std::vector<uint8_t>;

void WriteSeed(const std::string& path, uint8_t first, const Bytes& body) {
  std::ofstream out(path, std::ios::binary);
  out.put(static_cast<char>(first));
  out.write(reinterpret_cast<const char*>(body.data()), static_cast<std::streamsize>(body.size()));
  if (!out) {
    std::fprintf(stderr, "cannot write %s\n", path.c_str());
    std::exit(1);
  }
}

kvllm::BlockRecord Record(int32_t block_size, const char* k, const char* v, size_t data_bytes,
                          uint64_t parent) {
  kvllm::BlockRecord r;
  r.hash = 0x1234567890abcdefULL + data_bytes;
  r.parent = parent;
  r.model_identity = 42;
  r.k_format = k;
  r.v_format = v;
  r.block_size = block_size;
  for (int32_t i = 0; i < block_size; ++i) r.tokens.push_back(i * 7 + 1);
  for (size_t i = 0; i < data_bytes; ++i) r.data.push_back(static_cast<uint8_t>(i * 31));
  return r;
}

// GGUF little-endian writers.
template <typename T>
void Put(Bytes* b, T v) {
  uint8_t raw[sizeof(T)];
  std::memcpy(raw, &v, sizeof(T));
  b->insert(b->end(), raw, raw + sizeof(T));
}
void PutString(Bytes* b, const std::string& s) {
  Put<uint64_t>(b, s.size());
  b->insert(b->end(), s.begin(), s.end());
}

// GGUF v3: one value of each type, nested arrays, and two small tensors.
Bytes MinimalGguf() {
  Bytes b;
  b.insert(b.end(), {'G', 'G', 'U', 'F'});
  Put<uint32_t>(&b, 3);
  Put<uint64_t>(&b, 2);   // tensors
  Put<uint64_t>(&b, 14);  // metadata values
  auto key = [&](const char* k, uint32_t type) { PutString(&b, k), Put<uint32_t>(&b, type); };
  key("general.architecture", 8), PutString(&b, "llama");
  key("general.alignment", 4), Put<uint32_t>(&b, 32);
  key("a.u8", 0), Put<uint8_t>(&b, 200);
  key("a.i8", 1), Put<int8_t>(&b, -3);
  key("a.u16", 2), Put<uint16_t>(&b, 60000);
  key("a.i16", 3), Put<int16_t>(&b, -30000);
  key("a.i32", 5), Put<int32_t>(&b, -7);
  key("a.f32", 6), Put<float>(&b, 1.5f);
  key("a.bool", 7), Put<uint8_t>(&b, 1);
  key("a.u64", 10), Put<uint64_t>(&b, 1ULL << 40);
  key("a.i64", 11), Put<int64_t>(&b, -(1LL << 40));
  key("a.f64", 12), Put<double>(&b, -2.25);
  key("a.strings", 9), Put<uint32_t>(&b, 8), Put<uint64_t>(&b, 2);
  PutString(&b, "x"), PutString(&b, "\xE2\x96\x81y");
  key("a.nested", 9), Put<uint32_t>(&b, 9), Put<uint64_t>(&b, 2);
  for (int i = 0; i < 2; ++i) Put<uint32_t>(&b, 4), Put<uint64_t>(&b, 1), Put<uint32_t>(&b, i);
  // tensors: name, n_dims, ne..., type, offset
  PutString(&b, "t.f32"), Put<uint32_t>(&b, 2), Put<uint64_t>(&b, 2), Put<uint64_t>(&b, 2);
  Put<uint32_t>(&b, 0), Put<uint64_t>(&b, 0);
  PutString(&b, "t.q8_0"), Put<uint32_t>(&b, 1), Put<uint64_t>(&b, 32);
  Put<uint32_t>(&b, 8), Put<uint64_t>(&b, 32);
  while (b.size() % 32 != 0) b.push_back(0);
  for (int i = 0; i < 32 + 34; ++i) b.push_back(static_cast<uint8_t>(i));
  return b;
}

Bytes Ops(std::initializer_list<int> ops) { return Bytes(ops.begin(), ops.end()); }

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: make_seeds CORPUS_DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  using kvllm::EncodeBlock;
  // block_record: the first byte's low bit asks the target to fix the checksum.
  const kvllm::BlockRecord a = Record(4, "f16", "f16", 64, 0);
  const kvllm::BlockRecord b = Record(1, "q8_0", "kivi2", 34, a.hash);
  WriteSeed(dir + "/block_record/f16_bs4", 0, EncodeBlock(a));
  WriteSeed(dir + "/block_record/q8_0_bs1", 0, EncodeBlock(b));
  WriteSeed(dir + "/block_record/fix_checksum", 1, EncodeBlock(Record(2, "f32", "q4_0", 0, 9)));

  // session_file: saved for real, then read back.
  const std::string tmp = dir + "/session_file/.tmp";
  kvllm::SessionData session;
  session.metadata = R"({"tokens":[1,2,3,4,5],"model":"tiny","k":"f16","v":"f16"})";
  session.blocks = {EncodeBlock(a), EncodeBlock(b)};
  for (int blocks : {0, 2}) {
    kvllm::SessionData s = session;
    s.blocks.resize(blocks);
    if (!kvllm::SaveSessionFile(tmp, s).ok()) return 1;
    std::ifstream in(tmp, std::ios::binary);
    const Bytes bytes{std::istreambuf_iterator<char>(in), {}};
    WriteSeed(dir + "/session_file/blocks" + std::to_string(blocks), blocks == 0 ? 0 : 1, bytes);
  }
  unlink(tmp.c_str());

  {  // not a WriteSeed: the gguf target reads the whole input
    const Bytes g = MinimalGguf();
    std::ofstream out(dir + "/gguf/minimal.gguf", std::ios::binary);
    out.write(reinterpret_cast<const char*>(g.data()), static_cast<std::streamsize>(g.size()));
  }

  // kv_cache: block size, blocks, mode, then ops (kv_cache_fuzz.cc's Op).
  // Two sequences share a cached prefix; a fork diverges inside a shared block.
  WriteSeed(dir + "/kv_cache/prefix_fork", 2,
            Ops({/*blocks=*/3, /*mode=*/0,
                 0, 0, 9, 0, 1, 2, 0, 1, 2, 0, 1, 2,  // append 9 tokens to seq 0
                 3, 0, 9,                             // cache its full blocks
                 2, 0, 1,                             // fork 0 -> 1
                 0, 1, 2, 1, 1,                       // seq 1 appends 2 (copy-on-write)
                 1, 0,                                // free 0
                 4, 2, 0, 9, 0, 9,                    // seq 2 attaches history 0
                 6, 1, 0,                             // export/import seq 1
                 7}));
  // A tiny pool: appends evict cached-free blocks.
  WriteSeed(dir + "/kv_cache/evict", 1,
            Ops({/*blocks=*/1, /*mode=*/1, 0, 0, 4, 0, 1, 0, 1, 3, 0, 4, 1, 0,
                 0, 1, 4, 2, 2, 2, 2, 3, 1, 4, 1, 1, 4, 3, 0, 4, 0, 2, 7}));
  // A sliding window of 5 with 2 sinks.
  WriteSeed(dir + "/kv_cache/window", 0,
            Ops({/*blocks=*/5, /*mode=*/3, 4, 2, 0, 0, 12, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1, 1,
                 5, 0, 2, 0, 3, 0, 0, 3, 2, 2, 2, 5, 0, 5, 3, 7}));
  return 0;
}
