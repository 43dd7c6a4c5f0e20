// GgufFile: a read-only view of a GGUF (v2 or v3) file. Metadata is parsed into values; tensor
// data stays in the mmap'd file and GgufFile never copies it (a model may copy tensors into a
// layout of its own and Discard the file's pages of them). Every length, count and offset is
// checked against the file's size before it is used: a corrupt or truncated file yields a Status
// that names the offending field, never a crash. Parsing also rejects duplicate keys or tensor
// names, misaligned or overlapping tensor data, and more than 2^24 metadata values in all (each
// costs ~100 bytes of memory, so the cap bounds what a crafted file can make the parser
// allocate).
//
// File layout (little-endian):
//   magic "GGUF" | u32 version | u64 n_tensors | u64 n_kv
//   n_kv × (string key, u32 value type, value)
//   n_tensors × (string name, u32 n_dims, n_dims × u64 ne, u32 ggml type, u64 offset)
//   padding to general.alignment (default 32) | tensor data (offsets relative to here)
// Strings are u64 length + bytes (no NUL). Arrays are u32 element type, u64 count, elements.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "base/huge_pages.h"
#include "base/status.h"

namespace kvllm::gguf {

// Arrays may nest (arrays of arrays); deeper nesting than this is rejected as corrupt so that a
// crafted file cannot exhaust the stack.
inline constexpr int kMaxArrayNesting = 8;

enum class ValueType : uint32_t {
  kUint8 = 0, kInt8 = 1, kUint16 = 2, kInt16 = 3, kUint32 = 4, kInt32 = 5, kFloat32 = 6,
  kBool = 7, kString = 8, kArray = 9, kUint64 = 10, kInt64 = 11, kFloat64 = 12,
};
const char* ValueTypeName(ValueType type);  // "u32", "string", ...; "unknown" otherwise

// One metadata value. Scalars are widened into `u` (unsigned and bool), `i` (signed) or
// `f` (floating); `type` says which member is meaningful.
struct Value {
  ValueType type = ValueType::kUint8;
  uint64_t u = 0;
  int64_t i = 0;
  double f = 0;
  std::string str;               // kString
  ValueType elem_type = ValueType::kUint8;  // kArray: type of the elements
  std::vector<Value> array;      // kArray (arrays may nest)

  bool IsInteger() const;
  bool IsFloat() const { return type == ValueType::kFloat32 || type == ValueType::kFloat64; }
  // Short human-readable rendering; long arrays are abbreviated ("[32000 × string] [...]"),
  // strings are quoted and escaped, and very long strings are cut with their byte count noted.
  std::string ToString(size_t max_elems = 8) const;
};

// Known ggml tensor types (numbering is GGUF's). The reader knows the block layout of every
// type below so that it can validate any file's data extents; kvllm computes with a subset.
enum class GgmlType : uint32_t {
  kF32 = 0, kF16 = 1, kQ4_0 = 2, kQ4_1 = 3, kQ5_0 = 6, kQ5_1 = 7, kQ8_0 = 8, kQ8_1 = 9,
  kQ2_K = 10, kQ3_K = 11, kQ4_K = 12, kQ5_K = 13, kQ6_K = 14, kQ8_K = 15,
  kIQ2_XXS = 16, kIQ2_XS = 17, kIQ3_XXS = 18, kIQ1_S = 19, kIQ4_NL = 20, kIQ3_S = 21,
  kIQ2_S = 22, kIQ4_XS = 23, kI8 = 24, kI16 = 25, kI32 = 26, kI64 = 27, kF64 = 28,
  kIQ1_M = 29, kBF16 = 30,
};
struct GgmlTypeTraits {
  const char* name;     // nullptr for numbers that are not a known type
  uint32_t block_size;  // elements per block
  uint32_t type_size;   // bytes per block
};
// Traits of a type number; name == nullptr when the number is unknown.
GgmlTypeTraits GetGgmlTypeTraits(uint32_t type);

struct TensorInfo {
  std::string name;
  uint32_t n_dims = 0;
  uint64_t ne[4] = {1, 1, 1, 1};  // ne[0] is the innermost (contiguous) dimension
  GgmlType type = GgmlType::kF32;
  uint64_t offset = 0;            // relative to the start of the data section
  uint64_t n_elements = 0;
  uint64_t n_bytes = 0;
  const void* data = nullptr;     // points into the mapping
};

// How Open makes the file's bytes addressable.
enum class LoadMode {
  // mmap the file: nothing is read up front and processes share the page cache, but the
  // mapping is in 4 KiB pages.
  kMmap,
  // Read the file into private memory in 2 MiB transparent huge pages where the kernel allows
  // them (madvise): one read at open, then every weight streamed by decode crosses a page
  // boundary 512 times less often (fewer TLB misses and prefetcher restarts). llama.cpp's
  // --no-mmap.
  kRead,
};

class GgufFile {
 public:
  // Makes `path` addressable read-only as `mode` says and parses it.
  static StatusOr<GgufFile> Open(const std::string& path, LoadMode mode = LoadMode::kMmap);
  // Parses a buffer the caller keeps alive for the lifetime of the result (tests, fuzzing).
  static StatusOr<GgufFile> Parse(const void* data, size_t size);

  GgufFile(GgufFile&&) noexcept;
  GgufFile& operator=(GgufFile&&) noexcept;
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;
  ~GgufFile();

  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // File offset of the tensor data section (TensorInfo::offset is relative to it). It can lie
  // past the end of the file when the file holds no tensor data.
  uint64_t data_offset() const { return data_offset_; }
  size_t file_size() const { return size_; }
  const std::string& path() const { return path_; }
  // The bytes before the tensor data: metadata and tensor layout (a model's identity).
  std::span<const uint8_t> header() const {
    return {data_, static_cast<size_t>(std::min<uint64_t>(data_offset_, size_))};
  }

  // Metadata in file order.
  const std::vector<std::pair<std::string, Value>>& metadata() const { return metadata_; }
  const Value* Find(std::string_view key) const;  // nullptr when absent

  // Typed getters: an absent key gives `fallback` when one is given, otherwise an error;
  // a present key of an incompatible type is always an error naming the key.
  // GetUint accepts every integer type (not bool); a negative signed value is an error.
  StatusOr<uint64_t> GetUint(std::string_view key) const;
  StatusOr<uint64_t> GetUint(std::string_view key, uint64_t fallback) const;
  StatusOr<double> GetFloat(std::string_view key) const;  // accepts ints and floats
  StatusOr<double> GetFloat(std::string_view key, double fallback) const;
  StatusOr<std::string> GetString(std::string_view key) const;
  StatusOr<bool> GetBool(std::string_view key, bool fallback) const;

  const std::vector<TensorInfo>& tensors() const { return tensors_; }
  const TensorInfo* FindTensor(std::string_view name) const;  // nullptr when absent

  // The caller will no longer read the n bytes at p, part of this file's data (tensors it has
  // copied elsewhere): the pages wholly inside go back to the system. A mapped file's pages
  // would be read from the file again if touched; memory read with LoadMode::kRead would read
  // as zeros. Does nothing to a caller's buffer (Parse).
  void Discard(const void* p, size_t n);

 private:
  GgufFile() = default;
  Status ParseAll();
  void Unmap();

  std::string path_;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  // What holds data_ when it is not the caller's buffer: the file's mapping, or (--no-mmap)
  // the file read into huge-page memory.
  void* map_ = nullptr;
  size_t map_bytes_ = 0;
  HugePageBuffer owned_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::pair<std::string, Value>> metadata_;
  std::map<std::string, size_t, std::less<>> metadata_index_;
  std::vector<TensorInfo> tensors_;
  std::map<std::string, size_t, std::less<>> tensor_index_;
};

}  // namespace kvllm::gguf
