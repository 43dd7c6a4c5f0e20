#include "gguf/gguf_file.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <type_traits>
#include <utility>

namespace kvllm::gguf {
namespace {

// Values are read with memcpy straight from the file.
static_assert(std::endian::native == std::endian::little,
              "the GGUF reader needs a little-endian host");

constexpr char kMagic[4] = {'G', 'G', 'U', 'F'};
constexpr size_t kHeaderBytes = 4 + 4 + 8 + 8;
constexpr uint32_t kMaxDims = 4;
// The smallest encodings of a key/value pair (empty key, type, one-byte value) and of a tensor
// info (empty name, n_dims, one ne, type, offset). A count larger than the remaining bytes can
// hold at this size is corrupt, and is rejected before anything is allocated for it.
constexpr uint64_t kMinKeyValueBytes = 8 + 4 + 1;
constexpr uint64_t kMinTensorInfoBytes = 8 + 4 + 8 + 4 + 8;
// Each parsed value costs ~100 bytes of memory, so a crafted file of tiny values could ask for
// ~100x its size. Real files hold about a million (vocabulary and merges); this leaves headroom.
constexpr uint64_t kMaxMetadataValues = uint64_t{1} << 24;
// Keeps `kvllm inspect` output readable when a value is a multi-kilobyte chat template.
constexpr size_t kMaxRenderedStringBytes = 256;
// Names in error messages come from possibly corrupt files: keep them short.
constexpr size_t kMaxQuotedNameBytes = 64;

void AppendPiece(std::string& out, std::string_view piece) { out.append(piece); }

template <typename T>
  requires std::is_integral_v<T>
void AppendPiece(std::string& out, T value) {
  out.append(std::to_string(value));
}

template <typename... Args>
std::string StrCat(const Args&... args) {
  std::string out;
  (AppendPiece(out, args), ...);
  return out;
}

template <typename... Args>
Status Error(const Args&... args) {
  return Status::Error(StrCat("gguf: ", args...));
}

// Prefixes a failed status with `context()`; the context is only built on failure so that the
// success path (hundreds of thousands of vocabulary strings) allocates no message strings.
template <typename ContextFn>
Status WithContext(Status status, ContextFn context) {
  if (status.ok()) return status;
  return Status::Error(StrCat(context(), ": ", status.message()));
}

// Appends `s` with control characters, quotes and backslashes escaped, cut to at most
// `max_bytes` (on a UTF-8 character boundary). Returns whether it was cut.
bool AppendEscaped(std::string& out, std::string_view s, size_t max_bytes) {
  bool cut = false;
  if (s.size() > max_bytes) {
    size_t end = max_bytes;
    while (end > 0 && (static_cast<uint8_t>(s[end]) & 0xC0) == 0x80) --end;
    s = s.substr(0, end);
    cut = true;
  }
  for (char c : s) {
    const auto byte = static_cast<uint8_t>(c);
    switch (c) {
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '"': out += "\\\""; break;
      case '\'': out += "\\'"; break;
      case '\\': out += "\\\\"; break;
      default:
        if (byte < 0x20 || byte == 0x7F) {
          constexpr char kHex[] = "0123456789abcdef";
          out += "\\x";
          out += kHex[byte >> 4];
          out += kHex[byte & 0xF];
        } else {
          out += c;
        }
    }
  }
  return cut;
}

// A key or tensor name as it appears in error messages.
std::string Quoted(std::string_view name) {
  std::string out = "'";
  if (AppendEscaped(out, name, kMaxQuotedNameBytes)) out += "...";
  out += '\'';
  return out;
}

bool IsKnownValueType(uint32_t type) { return type <= static_cast<uint32_t>(ValueType::kFloat64); }

bool IsSignedType(ValueType type) {
  return type == ValueType::kInt8 || type == ValueType::kInt16 || type == ValueType::kInt32 ||
         type == ValueType::kInt64;
}

uint64_t MinEncodedBytes(ValueType type) {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kBool:
      return 1;
    case ValueType::kUint16:
    case ValueType::kInt16:
      return 2;
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kFloat32:
      return 4;
    case ValueType::kUint64:
    case ValueType::kInt64:
    case ValueType::kFloat64:
    case ValueType::kString:  // the length alone
      return 8;
    case ValueType::kArray:  // element type and count
      return 4 + 8;
  }
  return 1;
}

// A cursor over the file that refuses to step past its end.
class Reader {
 public:
  Reader(const uint8_t* data, size_t size, size_t pos) : data_(data), size_(size), pos_(pos) {}

  size_t pos() const { return pos_; }
  size_t remaining() const { return size_ - pos_; }

  // Whether `count` items of at least `min_bytes` each could fit in the rest of the file.
  bool CanHold(uint64_t count, uint64_t min_bytes) const {
    return count <= remaining() / min_bytes;
  }

  template <typename T>
  Status Read(T* out, std::string_view what) {
    if (remaining() < sizeof(T)) {
      return Status::Error(StrCat(what, " at offset ", pos_, " needs ", sizeof(T),
                                  " bytes but the file ends at ", size_));
    }
    std::memcpy(out, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return Status::Ok();
  }

  Status ReadString(std::string* out) {
    uint64_t length = 0;
    KVLLM_RETURN_IF_ERROR(Read(&length, "string length"));
    if (length > remaining()) {
      return Status::Error(StrCat("string length ", length, " exceeds file size (", remaining(),
                                  " bytes left at offset ", pos_, ")"));
    }
    out->assign(reinterpret_cast<const char*>(data_ + pos_), length);
    pos_ += length;
    return Status::Ok();
  }

 private:
  const uint8_t* data_;
  size_t size_;
  size_t pos_;
};

template <typename T>
Status ReadScalar(Reader& reader, ValueType type, Value* out) {
  T raw{};
  KVLLM_RETURN_IF_ERROR(reader.Read(&raw, ValueTypeName(type)));
  if constexpr (std::is_floating_point_v<T>) {
    out->f = raw;
  } else if constexpr (std::is_signed_v<T>) {
    out->i = raw;
  } else {
    out->u = raw;
  }
  return Status::Ok();
}

// Reads one value of `type` (already known to be valid). `depth` is the number of arrays
// enclosing it; `values_left` is the file-wide budget of values.
Status ReadValue(Reader& reader, ValueType type, int depth, uint64_t& values_left, Value* out) {
  if (values_left == 0) {
    return Status::Error(StrCat("metadata holds more than ", kMaxMetadataValues, " values"));
  }
  --values_left;
  out->type = type;
  switch (type) {
    case ValueType::kUint8: return ReadScalar<uint8_t>(reader, type, out);
    case ValueType::kInt8: return ReadScalar<int8_t>(reader, type, out);
    case ValueType::kUint16: return ReadScalar<uint16_t>(reader, type, out);
    case ValueType::kInt16: return ReadScalar<int16_t>(reader, type, out);
    case ValueType::kUint32: return ReadScalar<uint32_t>(reader, type, out);
    case ValueType::kInt32: return ReadScalar<int32_t>(reader, type, out);
    case ValueType::kFloat32: return ReadScalar<float>(reader, type, out);
    case ValueType::kUint64: return ReadScalar<uint64_t>(reader, type, out);
    case ValueType::kInt64: return ReadScalar<int64_t>(reader, type, out);
    case ValueType::kFloat64: return ReadScalar<double>(reader, type, out);
    case ValueType::kBool: {
      KVLLM_RETURN_IF_ERROR(ReadScalar<uint8_t>(reader, type, out));
      if (out->u > 1) return Status::Error(StrCat("bool value ", out->u, " is neither 0 nor 1"));
      return Status::Ok();
    }
    case ValueType::kString:
      return reader.ReadString(&out->str);
    case ValueType::kArray: {
      if (depth >= kMaxArrayNesting) {
        return Status::Error(StrCat("arrays nest deeper than ", kMaxArrayNesting, " levels"));
      }
      uint32_t raw_elem_type = 0;
      KVLLM_RETURN_IF_ERROR(reader.Read(&raw_elem_type, "array element type"));
      if (!IsKnownValueType(raw_elem_type)) {
        return Status::Error(StrCat("unknown array element type ", raw_elem_type));
      }
      const auto elem_type = static_cast<ValueType>(raw_elem_type);
      uint64_t count = 0;
      KVLLM_RETURN_IF_ERROR(reader.Read(&count, "array count"));
      if (!reader.CanHold(count, MinEncodedBytes(elem_type))) {
        return Status::Error(StrCat("array of ", count, " ", ValueTypeName(elem_type),
                                    " exceeds what the file can hold (", reader.remaining(),
                                    " bytes left)"));
      }
      if (count > values_left) {
        return Status::Error(StrCat("metadata holds more than ", kMaxMetadataValues, " values"));
      }
      out->elem_type = elem_type;
      out->array.resize(count);
      for (uint64_t i = 0; i < count; ++i) {
        KVLLM_RETURN_IF_ERROR(WithContext(
            ReadValue(reader, elem_type, depth + 1, values_left, &out->array[i]),
            [i] { return StrCat("element ", i); }));
      }
      return Status::Ok();
    }
  }
  return Status::Error("unreachable value type");
}

void AppendFloat(std::string& out, double value, bool single) {
  char buf[64];
  const std::to_chars_result result =
      single ? std::to_chars(buf, buf + sizeof(buf), static_cast<float>(value))
             : std::to_chars(buf, buf + sizeof(buf), value);
  out.append(buf, result.ptr);
}

void AppendValue(std::string& out, const Value& value, size_t max_elems) {
  switch (value.type) {
    case ValueType::kUint8:
    case ValueType::kUint16:
    case ValueType::kUint32:
    case ValueType::kUint64:
      out += std::to_string(value.u);
      return;
    case ValueType::kInt8:
    case ValueType::kInt16:
    case ValueType::kInt32:
    case ValueType::kInt64:
      out += std::to_string(value.i);
      return;
    case ValueType::kFloat32:
    case ValueType::kFloat64:
      AppendFloat(out, value.f, value.type == ValueType::kFloat32);
      return;
    case ValueType::kBool:
      out += value.u != 0 ? "true" : "false";
      return;
    case ValueType::kString:
      out += '"';
      if (AppendEscaped(out, value.str, kMaxRenderedStringBytes)) {
        out += StrCat("\"... (", value.str.size(), " bytes)");
      } else {
        out += '"';
      }
      return;
    case ValueType::kArray: {
      const size_t n = value.array.size();
      if (n > max_elems) out += StrCat("[", n, " × ", ValueTypeName(value.elem_type), "] ");
      out += '[';
      for (size_t k = 0; k < std::min(n, max_elems); ++k) {
        if (k > 0) out += ", ";
        AppendValue(out, value.array[k], max_elems);
      }
      if (n > max_elems) out += max_elems > 0 ? ", ..." : "...";
      out += ']';
      return;
    }
  }
}

constexpr GgmlTypeTraits kUnknownType = {nullptr, 0, 0};
// Indexed by type number; block sizes and byte sizes are ggml's (QK_K = 256).
constexpr GgmlTypeTraits kGgmlTypes[] = {
    {"f32", 1, 4},           // 0
    {"f16", 1, 2},           // 1
    {"q4_0", 32, 18},        // 2
    {"q4_1", 32, 20},        // 3
    kUnknownType,            // 4: Q4_2, removed from ggml
    kUnknownType,            // 5: Q4_3, removed from ggml
    {"q5_0", 32, 22},        // 6
    {"q5_1", 32, 24},        // 7
    {"q8_0", 32, 34},        // 8
    {"q8_1", 32, 36},        // 9
    {"q2_K", 256, 84},       // 10
    {"q3_K", 256, 110},      // 11
    {"q4_K", 256, 144},      // 12
    {"q5_K", 256, 176},      // 13
    {"q6_K", 256, 210},      // 14
    {"q8_K", 256, 292},      // 15
    {"iq2_xxs", 256, 66},    // 16
    {"iq2_xs", 256, 74},     // 17
    {"iq3_xxs", 256, 98},    // 18
    {"iq1_s", 256, 50},      // 19
    {"iq4_nl", 32, 18},      // 20
    {"iq3_s", 256, 110},     // 21
    {"iq2_s", 256, 82},      // 22
    {"iq4_xs", 256, 136},    // 23
    {"i8", 1, 1},            // 24
    {"i16", 1, 2},           // 25
    {"i32", 1, 4},           // 26
    {"i64", 1, 8},           // 27
    {"f64", 1, 8},           // 28
    {"iq1_m", 256, 56},      // 29
    {"bf16", 1, 2},          // 30
};
static_assert(std::size(kGgmlTypes) == static_cast<size_t>(GgmlType::kBF16) + 1);

// Fills n_elements and n_bytes, checking the shape against the type's block layout.
Status ComputeTensorSize(TensorInfo& info, const GgmlTypeTraits& traits) {
  uint64_t n_elements = 1;
  for (uint32_t d = 0; d < info.n_dims; ++d) {
    if (__builtin_mul_overflow(n_elements, info.ne[d], &n_elements) ||
        n_elements > static_cast<uint64_t>(INT64_MAX)) {
      return Status::Error("dimension product overflows");
    }
  }
  if (info.ne[0] % traits.block_size != 0) {
    return Status::Error(StrCat("ne[0] = ", info.ne[0], " is not a multiple of the ", traits.name,
                                " block size ", traits.block_size));
  }
  uint64_t n_bytes = 0;
  if (__builtin_mul_overflow(n_elements / traits.block_size, uint64_t{traits.type_size},
                             &n_bytes)) {
    return Status::Error("byte size overflows");
  }
  info.n_elements = n_elements;
  info.n_bytes = n_bytes;
  return Status::Ok();
}

}  // namespace

const char* ValueTypeName(ValueType type) {
  switch (type) {
    case ValueType::kUint8: return "u8";
    case ValueType::kInt8: return "i8";
    case ValueType::kUint16: return "u16";
    case ValueType::kInt16: return "i16";
    case ValueType::kUint32: return "u32";
    case ValueType::kInt32: return "i32";
    case ValueType::kFloat32: return "f32";
    case ValueType::kBool: return "bool";
    case ValueType::kString: return "string";
    case ValueType::kArray: return "array";
    case ValueType::kUint64: return "u64";
    case ValueType::kInt64: return "i64";
    case ValueType::kFloat64: return "f64";
  }
  return "unknown";
}

bool Value::IsInteger() const {
  switch (type) {
    case ValueType::kUint8:
    case ValueType::kInt8:
    case ValueType::kUint16:
    case ValueType::kInt16:
    case ValueType::kUint32:
    case ValueType::kInt32:
    case ValueType::kUint64:
    case ValueType::kInt64:
      return true;
    default:
      return false;
  }
}

std::string Value::ToString(size_t max_elems) const {
  std::string out;
  AppendValue(out, *this, max_elems);
  return out;
}

GgmlTypeTraits GetGgmlTypeTraits(uint32_t type) {
  return type < std::size(kGgmlTypes) ? kGgmlTypes[type] : kUnknownType;
}

namespace {

// The file read into huge-page memory (see HugePageBuffer), made read-only as a mapping is.
StatusOr<HugePageBuffer> ReadIntoHugePages(int fd, const std::string& path, size_t size) {
  HugePageBuffer buffer = HugePageBuffer::Allocate(size);
  if (buffer.data() == nullptr) {
    return Error("cannot allocate ", size, " bytes to read '", path, "' into (--no-mmap): ",
                 std::strerror(errno));
  }
  size_t done = 0;
  while (done < size) {
    const ssize_t got = ::pread(fd, buffer.data() + done, size - done, static_cast<off_t>(done));
    if (got < 0 && errno == EINTR) continue;
    if (got <= 0) {
      const std::string why = got < 0 ? std::strerror(errno) : "the file shrank while read";
      return Error("cannot read '", path, "' at byte ", done, " of ", size, ": ", why);
    }
    done += static_cast<size_t>(got);
  }
  buffer.MakeReadOnly();
  return buffer;
}

}  // namespace

StatusOr<GgufFile> GgufFile::Open(const std::string& path, LoadMode mode) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error("cannot open '", path, "': ", std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return Error("cannot stat '", path, "': ", std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return Error("'", path, "' is not a regular file");
  }
  if (st.st_size == 0) {
    ::close(fd);
    return Error("'", path, "' is empty (0 bytes)");
  }
  const auto size = static_cast<size_t>(st.st_size);
  GgufFile file;
  file.path_ = path;
  file.size_ = size;
  if (mode == LoadMode::kRead) {
    StatusOr<HugePageBuffer> read = ReadIntoHugePages(fd, path, size);
    ::close(fd);
    if (!read.ok()) return read.status();
    file.owned_ = std::move(*read);
    file.data_ = file.owned_.data();
  } else {
    void* map = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
    const int map_errno = errno;
    ::close(fd);  // the mapping keeps its own reference to the file
    if (map == MAP_FAILED) return Error("cannot mmap '", path, "': ", std::strerror(map_errno));
    file.map_ = map;
    file.map_bytes_ = size;
    file.data_ = static_cast<const uint8_t*>(map);
  }
  const Status status = file.ParseAll();
  if (!status.ok()) return Status::Error(StrCat(status.message(), " (in '", path, "')"));
  return file;
}

StatusOr<GgufFile> GgufFile::Parse(const void* data, size_t size) {
  if (data == nullptr && size != 0) return Error("null buffer of ", size, " bytes");
  GgufFile file;
  file.data_ = static_cast<const uint8_t*>(data);
  file.size_ = size;
  KVLLM_RETURN_IF_ERROR(file.ParseAll());
  return file;
}

GgufFile::GgufFile(GgufFile&& other) noexcept { *this = std::move(other); }

GgufFile& GgufFile::operator=(GgufFile&& other) noexcept {
  if (this == &other) return *this;
  Unmap();
  path_ = std::move(other.path_);
  data_ = std::exchange(other.data_, nullptr);
  size_ = std::exchange(other.size_, 0);
  map_ = std::exchange(other.map_, nullptr);
  map_bytes_ = std::exchange(other.map_bytes_, 0);
  owned_ = std::move(other.owned_);
  version_ = other.version_;
  alignment_ = other.alignment_;
  data_offset_ = other.data_offset_;
  metadata_ = std::move(other.metadata_);
  metadata_index_ = std::move(other.metadata_index_);
  tensors_ = std::move(other.tensors_);
  tensor_index_ = std::move(other.tensor_index_);
  return *this;
}

GgufFile::~GgufFile() { Unmap(); }

void GgufFile::Discard(const void* p, size_t n) {
  if (map_ == nullptr && owned_.data() == nullptr) return;
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(p);
  const uintptr_t first = (begin + page - 1) / page * page, last = (begin + n) / page * page;
  KVLLM_CHECK(begin >= reinterpret_cast<uintptr_t>(data_) &&
              begin + n <= reinterpret_cast<uintptr_t>(data_) + size_);
  if (first < last) ::madvise(reinterpret_cast<void*>(first), last - first, MADV_DONTNEED);
}

void GgufFile::Unmap() {
  if (map_ != nullptr) ::munmap(map_, map_bytes_);
  map_ = nullptr;
  map_bytes_ = 0;
  owned_ = HugePageBuffer();
  data_ = nullptr;
  size_ = 0;
}

Status GgufFile::ParseAll() {
  if (size_ == 0) return Error("file is empty (0 bytes)");
  if (std::memcmp(data_, kMagic, std::min(size_, sizeof(kMagic))) != 0) {
    return Error("bad magic (not a GGUF file)");
  }
  if (size_ < kHeaderBytes) {
    return Error("truncated header: the file is ", size_, " bytes, the header needs ",
                 kHeaderBytes);
  }
  Reader reader(data_, size_, sizeof(kMagic));
  KVLLM_RETURN_IF_ERROR(reader.Read(&version_, "version"));
  if (version_ != 2 && version_ != 3) {
    const uint32_t swapped = __builtin_bswap32(version_);
    return Error("unsupported version ", version_,
                 swapped == 2 || swapped == 3 ? " (a big-endian file?)" : "",
                 "; kvllm reads versions 2 and 3");
  }
  uint64_t n_tensors = 0;
  uint64_t n_kv = 0;
  KVLLM_RETURN_IF_ERROR(reader.Read(&n_tensors, "n_tensors"));
  KVLLM_RETURN_IF_ERROR(reader.Read(&n_kv, "n_kv"));

  if (!reader.CanHold(n_kv, kMinKeyValueBytes)) {
    return Error("n_kv ", n_kv, " exceeds what the file can hold");
  }
  metadata_.reserve(n_kv);
  uint64_t values_left = kMaxMetadataValues;
  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key;
    KVLLM_RETURN_IF_ERROR(WithContext(reader.ReadString(&key),
                                      [k] { return StrCat("gguf: metadata key #", k); }));
    const auto context = [k, &key] { return StrCat("gguf: metadata key #", k, " ", Quoted(key)); };
    uint32_t raw_type = 0;
    KVLLM_RETURN_IF_ERROR(WithContext(reader.Read(&raw_type, "value type"), context));
    if (!IsKnownValueType(raw_type)) {
      return Status::Error(StrCat(context(), ": unknown value type ", raw_type));
    }
    Value value;
    KVLLM_RETURN_IF_ERROR(WithContext(
        ReadValue(reader, static_cast<ValueType>(raw_type), 0, values_left, &value), context));
    if (!metadata_index_.emplace(key, metadata_.size()).second) {
      return Status::Error(StrCat(context(), ": duplicate key"));
    }
    metadata_.emplace_back(std::move(key), std::move(value));
  }

  if (const Value* alignment = Find("general.alignment")) {
    if (alignment->type != ValueType::kUint32) {
      return Error("general.alignment has type ", ValueTypeName(alignment->type),
                   ", expected u32");
    }
    if (!std::has_single_bit(alignment->u)) {
      return Error("general.alignment ", alignment->u, " is not a non-zero power of two");
    }
    alignment_ = alignment->u;
  }

  if (!reader.CanHold(n_tensors, kMinTensorInfoBytes)) {
    return Error("n_tensors ", n_tensors, " exceeds what the file can hold");
  }
  tensors_.reserve(n_tensors);
  for (uint64_t t = 0; t < n_tensors; ++t) {
    TensorInfo info;
    KVLLM_RETURN_IF_ERROR(WithContext(reader.ReadString(&info.name),
                                      [t] { return StrCat("gguf: tensor #", t); }));
    const auto context = [&info] { return StrCat("gguf: tensor ", Quoted(info.name)); };
    KVLLM_RETURN_IF_ERROR(WithContext(reader.Read(&info.n_dims, "n_dims"), context));
    if (info.n_dims < 1 || info.n_dims > kMaxDims) {
      return Status::Error(StrCat(context(), ": n_dims ", info.n_dims, " is not in 1..", kMaxDims));
    }
    for (uint32_t d = 0; d < info.n_dims; ++d) {
      KVLLM_RETURN_IF_ERROR(WithContext(reader.Read(&info.ne[d], "ne"), context));
    }
    uint32_t raw_type = 0;
    KVLLM_RETURN_IF_ERROR(WithContext(reader.Read(&raw_type, "type"), context));
    KVLLM_RETURN_IF_ERROR(WithContext(reader.Read(&info.offset, "offset"), context));
    const GgmlTypeTraits traits = GetGgmlTypeTraits(raw_type);
    if (traits.name == nullptr) {
      return Status::Error(StrCat(context(), ": unknown type ", raw_type));
    }
    info.type = static_cast<GgmlType>(raw_type);
    KVLLM_RETURN_IF_ERROR(WithContext(ComputeTensorSize(info, traits), context));
    if (info.offset % alignment_ != 0) {
      return Status::Error(StrCat(context(), ": offset ", info.offset,
                                  " is not a multiple of the alignment ", alignment_));
    }
    if (!tensor_index_.emplace(info.name, tensors_.size()).second) {
      return Status::Error(StrCat("gguf: tensor #", t, " ", Quoted(info.name),
                                  ": duplicate name"));
    }
    tensors_.push_back(std::move(info));
  }

  // alignment_ <= 2^31 and pos <= size_, so this cannot overflow.
  data_offset_ = (reader.pos() + alignment_ - 1) & ~(alignment_ - 1);
  const uint64_t data_bytes = data_offset_ <= size_ ? size_ - data_offset_ : 0;
  for (TensorInfo& info : tensors_) {
    if (data_offset_ > size_ || info.offset > data_bytes ||
        info.n_bytes > data_bytes - info.offset) {
      return Error("tensor ", Quoted(info.name), ": data [", info.offset, ", +", info.n_bytes,
                   " bytes) lies outside the file (the data section at offset ", data_offset_,
                   " holds ", data_bytes, " bytes)");
    }
    info.data = data_ + data_offset_ + info.offset;
  }

  // Overlapping tensors mean a corrupt offset table; weights would silently alias.
  std::vector<const TensorInfo*> by_offset;
  by_offset.reserve(tensors_.size());
  for (const TensorInfo& info : tensors_) {
    if (info.n_bytes > 0) by_offset.push_back(&info);
  }
  std::sort(by_offset.begin(), by_offset.end(),
            [](const TensorInfo* a, const TensorInfo* b) { return a->offset < b->offset; });
  const TensorInfo* furthest = nullptr;
  for (const TensorInfo* info : by_offset) {
    if (furthest != nullptr && furthest->offset + furthest->n_bytes > info->offset) {
      return Error("tensors ", Quoted(furthest->name), " and ", Quoted(info->name), " overlap");
    }
    if (furthest == nullptr ||
        info->offset + info->n_bytes > furthest->offset + furthest->n_bytes) {
      furthest = info;
    }
  }
  return Status::Ok();
}

const Value* GgufFile::Find(std::string_view key) const {
  const auto it = metadata_index_.find(key);
  return it == metadata_index_.end() ? nullptr : &metadata_[it->second].second;
}

const TensorInfo* GgufFile::FindTensor(std::string_view name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

namespace {

Status MissingKey(std::string_view key) {
  return Error("metadata key ", Quoted(key), " is missing");
}

Status WrongType(std::string_view key, const Value& value, std::string_view expected) {
  return Error("metadata key ", Quoted(key), " has type ", ValueTypeName(value.type),
               ", expected ", expected);
}

StatusOr<uint64_t> AsUint(std::string_view key, const Value& value) {
  if (!value.IsInteger()) return WrongType(key, value, "an unsigned integer");
  if (!IsSignedType(value.type)) return value.u;
  if (value.i < 0) {
    return Error("metadata key ", Quoted(key), " is ", value.i, ", expected a non-negative value");
  }
  return static_cast<uint64_t>(value.i);
}

StatusOr<double> AsFloat(std::string_view key, const Value& value) {
  if (value.IsFloat()) return value.f;
  if (!value.IsInteger()) return WrongType(key, value, "a number");
  return IsSignedType(value.type) ? static_cast<double>(value.i) : static_cast<double>(value.u);
}

}  // namespace

StatusOr<uint64_t> GgufFile::GetUint(std::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr) return MissingKey(key);
  return AsUint(key, *value);
}

StatusOr<uint64_t> GgufFile::GetUint(std::string_view key, uint64_t fallback) const {
  const Value* value = Find(key);
  if (value == nullptr) return fallback;
  return AsUint(key, *value);
}

StatusOr<double> GgufFile::GetFloat(std::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr) return MissingKey(key);
  return AsFloat(key, *value);
}

StatusOr<double> GgufFile::GetFloat(std::string_view key, double fallback) const {
  const Value* value = Find(key);
  if (value == nullptr) return fallback;
  return AsFloat(key, *value);
}

StatusOr<std::string> GgufFile::GetString(std::string_view key) const {
  const Value* value = Find(key);
  if (value == nullptr) return MissingKey(key);
  if (value->type != ValueType::kString) return WrongType(key, *value, "string");
  return value->str;
}

StatusOr<bool> GgufFile::GetBool(std::string_view key, bool fallback) const {
  const Value* value = Find(key);
  if (value == nullptr) return fallback;
  if (value->type != ValueType::kBool) return WrongType(key, *value, "bool");
  return value->u != 0;
}

}  // namespace kvllm::gguf
