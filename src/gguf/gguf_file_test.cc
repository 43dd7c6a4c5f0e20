#include "gguf/gguf_file.h"

#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <gtest/gtest.h>

namespace kvllm::gguf {
namespace {

constexpr uint64_t kU64Max = std::numeric_limits<uint64_t>::max();

// Little-endian byte sink that remembers where every u64 went, so that the mutation test can
// aim at lengths, counts, dimensions and offsets.
class Bytes {
 public:
  template <typename T>
  Bytes& Put(T value) {
    if constexpr (std::is_same_v<T, uint64_t>) u64_positions_.push_back(bytes_.size());
    const auto* p = reinterpret_cast<const uint8_t*>(&value);
    bytes_.insert(bytes_.end(), p, p + sizeof(T));
    return *this;
  }
  Bytes& PutString(std::string_view s) {
    Put<uint64_t>(s.size());
    bytes_.insert(bytes_.end(), s.begin(), s.end());
    return *this;
  }
  Bytes& Append(const Bytes& other) {
    for (size_t pos : other.u64_positions_) u64_positions_.push_back(bytes_.size() + pos);
    bytes_.insert(bytes_.end(), other.bytes_.begin(), other.bytes_.end());
    return *this;
  }
  void Resize(size_t size) { bytes_.resize(size); }
  uint8_t& operator[](size_t pos) { return bytes_[pos]; }

  size_t size() const { return bytes_.size(); }
  const std::vector<uint8_t>& bytes() const { return bytes_; }
  const std::vector<size_t>& u64_positions() const { return u64_positions_; }

 private:
  std::vector<uint8_t> bytes_;
  std::vector<size_t> u64_positions_;
};

// Array payload: element type, count, then the already-encoded elements.
Bytes ArrayPayload(ValueType elem_type, uint64_t count, const Bytes& elements) {
  Bytes out;
  out.Put(static_cast<uint32_t>(elem_type)).Put(count).Append(elements);
  return out;
}

template <typename T>
Bytes ScalarArray(ValueType elem_type, const std::vector<T>& values) {
  Bytes elements;
  for (T v : values) elements.Put(v);
  return ArrayPayload(elem_type, values.size(), elements);
}

Bytes StringArray(const std::vector<std::string>& values) {
  Bytes elements;
  for (const std::string& v : values) elements.PutString(v);
  return ArrayPayload(ValueType::kString, values.size(), elements);
}

uint64_t AlignUp(uint64_t x, uint64_t alignment) {
  return (x + alignment - 1) / alignment * alignment;
}

uint8_t PatternByte(size_t tensor_index, uint64_t byte_index) {
  return static_cast<uint8_t>(tensor_index * 37 + byte_index * 7 + 1);
}

// Builds GGUF files in memory. Tensors without an explicit offset are laid out one after
// another at the alignment and get pattern data; the file ends right after the last one, so
// that any truncation cuts into something the parser must see.
class GgufBuilder {
 public:
  explicit GgufBuilder(uint32_t version = 3) : version_(version) {}

  // Writes general.alignment and lays the data out with it.
  GgufBuilder& Alignment(uint32_t alignment) {
    alignment_ = alignment;
    return Add<uint32_t>("general.alignment", ValueType::kUint32, alignment);
  }
  GgufBuilder& AddRaw(std::string_view key, uint32_t type, const Bytes& payload) {
    kv_.PutString(key).Put(type).Append(payload);
    ++n_kv_;
    return *this;
  }
  GgufBuilder& AddRaw(std::string_view key, ValueType type, const Bytes& payload) {
    return AddRaw(key, static_cast<uint32_t>(type), payload);
  }
  template <typename T>
  GgufBuilder& Add(std::string_view key, ValueType type, T value) {
    Bytes payload;
    payload.Put(value);
    return AddRaw(key, type, payload);
  }
  GgufBuilder& AddString(std::string_view key, std::string_view value) {
    Bytes payload;
    payload.PutString(value);
    return AddRaw(key, ValueType::kString, payload);
  }
  GgufBuilder& AddArray(std::string_view key, const Bytes& array_payload) {
    return AddRaw(key, ValueType::kArray, array_payload);
  }

  // `n_bytes` defaults to the size the type's block layout gives (0 for unknown types).
  GgufBuilder& AddTensor(std::string name, std::vector<uint64_t> ne, uint32_t type,
                         std::optional<uint64_t> offset = std::nullopt,
                         std::optional<uint64_t> n_bytes = std::nullopt) {
    tensors_.push_back({std::move(name), std::move(ne), type, offset, n_bytes});
    return *this;
  }
  GgufBuilder& AddTensor(std::string name, std::vector<uint64_t> ne, GgmlType type) {
    return AddTensor(std::move(name), std::move(ne), static_cast<uint32_t>(type));
  }

  std::vector<uint8_t> Build() {
    Bytes out;
    out.Put<uint32_t>(0x46554747).Put(version_).Put<uint64_t>(tensors_.size()).Put(n_kv_);
    out.Append(kv_);
    uint64_t cursor = 0;
    offsets_.clear();
    for (const TensorSpec& spec : tensors_) {
      uint64_t offset = spec.offset.value_or(AlignUp(cursor, alignment_));
      if (!spec.offset) cursor = offset + SizeOf(spec);
      offsets_.push_back(offset);
      out.PutString(spec.name).Put<uint32_t>(spec.ne.size());
      for (uint64_t n : spec.ne) out.Put(n);
      out.Put(spec.type).Put(offset);
    }
    data_offset_ = AlignUp(out.size(), alignment_);
    if (!tensors_.empty()) out.Resize(data_offset_ + cursor);
    for (size_t t = 0; t < tensors_.size(); ++t) {
      if (tensors_[t].offset) continue;
      for (uint64_t j = 0; j < SizeOf(tensors_[t]); ++j) {
        out[data_offset_ + offsets_[t] + j] = PatternByte(t, j);
      }
    }
    u64_positions_ = out.u64_positions();
    return out.bytes();
  }

  // Valid after Build().
  uint64_t data_offset() const { return data_offset_; }
  uint64_t offset(size_t tensor) const { return offsets_[tensor]; }
  const std::vector<size_t>& u64_positions() const { return u64_positions_; }

 private:
  struct TensorSpec {
    std::string name;
    std::vector<uint64_t> ne;
    uint32_t type;
    std::optional<uint64_t> offset;
    std::optional<uint64_t> n_bytes;
  };

  static uint64_t SizeOf(const TensorSpec& spec) {
    if (spec.n_bytes) return *spec.n_bytes;
    const GgmlTypeTraits traits = GetGgmlTypeTraits(spec.type);
    if (traits.name == nullptr) return 0;
    uint64_t n = 1;
    for (uint64_t d : spec.ne) n *= d;
    return n / traits.block_size * traits.type_size;
  }

  uint32_t version_;
  uint64_t alignment_ = 32;
  uint64_t n_kv_ = 0;
  Bytes kv_;
  std::vector<TensorSpec> tensors_;
  std::vector<uint64_t> offsets_;
  uint64_t data_offset_ = 0;
  std::vector<size_t> u64_positions_;
};

StatusOr<GgufFile> ParseBytes(const std::vector<uint8_t>& bytes) {
  return GgufFile::Parse(bytes.data(), bytes.size());
}

template <typename T>
void PatchAt(std::vector<uint8_t>& bytes, size_t pos, T value) {
  ASSERT_LE(pos + sizeof(T), bytes.size());
  std::memcpy(bytes.data() + pos, &value, sizeof(T));
}

// Asserts that `result` failed with a message containing `fragment`.
template <typename T>
void ExpectError(const StatusOr<T>& result, std::string_view fragment) {
  ASSERT_FALSE(result.ok()) << "expected an error containing: " << fragment;
  EXPECT_NE(result.status().message().find(fragment), std::string::npos)
      << "message: " << result.status().message() << "\nexpected to contain: " << fragment;
}

void ExpectParseError(const std::vector<uint8_t>& bytes, std::string_view fragment) {
  ExpectError(ParseBytes(bytes), fragment);
}

// A valid file with every metadata kind and a few tensors; `rows` scales the tensor data (a few
// KB at the default), so that a mutation test can keep most of its bytes structural.
GgufBuilder RichBuilder(uint64_t rows = 7) {
  GgufBuilder b;
  b.AddString("general.architecture", "llama")
      .AddString("general.name", "tiny test model")
      .Add<uint32_t>("llama.context_length", ValueType::kUint32, 2048)
      .Add<uint64_t>("llama.big", ValueType::kUint64, 1ULL << 40)
      .Add<float>("llama.rope.freq_base", ValueType::kFloat32, 10000.0f)
      .Add<double>("llama.eps", ValueType::kFloat64, 1e-5)
      .Add<uint8_t>("flag", ValueType::kBool, 1)
      .Add<int8_t>("i8", ValueType::kInt8, -5)
      .Add<int16_t>("i16", ValueType::kInt16, -300)
      .Add<uint16_t>("u16", ValueType::kUint16, 60000)
      .Add<int64_t>("i64", ValueType::kInt64, -1)
      .AddArray("tokenizer.ggml.tokens",
                StringArray({"<unk>", "<s>", "</s>", "hello", "world", "\xe2\x96\x81the", "a"}))
      .AddArray("tokenizer.ggml.scores",
                ScalarArray<float>(ValueType::kFloat32, {0, 0, 0, -1.5f, -2.5f, -3, -4}))
      .AddArray("tokenizer.ggml.token_type",
                ScalarArray<int32_t>(ValueType::kInt32, {2, 3, 3, 1, 1, 1, 1}));
  Bytes nested;
  nested.Append(ScalarArray<uint16_t>(ValueType::kUint16, {1, 2}))
      .Append(ScalarArray<uint16_t>(ValueType::kUint16, {3}));
  b.AddArray("nested", ArrayPayload(ValueType::kArray, 2, nested));
  b.AddTensor("token_embd.weight", {64, rows}, GgmlType::kF32)
      .AddTensor("blk.0.attn_q.weight", {64, rows}, GgmlType::kQ8_0)
      .AddTensor("blk.0.ffn_down.weight", {256, rows}, GgmlType::kQ4_K)
      .AddTensor("output_norm.weight", {64}, GgmlType::kF16);
  return b;
}

TEST(GgmlTypeTraitsTest, KnownTypesHaveGgmlBlockLayouts) {
  struct Expected {
    GgmlType type;
    const char* name;
    uint32_t block_size;
    uint32_t type_size;
  };
  const Expected kExpected[] = {
      {GgmlType::kF32, "f32", 1, 4},           {GgmlType::kF16, "f16", 1, 2},
      {GgmlType::kQ4_0, "q4_0", 32, 18},       {GgmlType::kQ4_1, "q4_1", 32, 20},
      {GgmlType::kQ5_0, "q5_0", 32, 22},       {GgmlType::kQ5_1, "q5_1", 32, 24},
      {GgmlType::kQ8_0, "q8_0", 32, 34},       {GgmlType::kQ8_1, "q8_1", 32, 36},
      {GgmlType::kQ2_K, "q2_K", 256, 84},      {GgmlType::kQ3_K, "q3_K", 256, 110},
      {GgmlType::kQ4_K, "q4_K", 256, 144},     {GgmlType::kQ5_K, "q5_K", 256, 176},
      {GgmlType::kQ6_K, "q6_K", 256, 210},     {GgmlType::kQ8_K, "q8_K", 256, 292},
      {GgmlType::kIQ2_XXS, "iq2_xxs", 256, 66}, {GgmlType::kIQ2_XS, "iq2_xs", 256, 74},
      {GgmlType::kIQ3_XXS, "iq3_xxs", 256, 98}, {GgmlType::kIQ1_S, "iq1_s", 256, 50},
      {GgmlType::kIQ4_NL, "iq4_nl", 32, 18},   {GgmlType::kIQ3_S, "iq3_s", 256, 110},
      {GgmlType::kIQ2_S, "iq2_s", 256, 82},    {GgmlType::kIQ4_XS, "iq4_xs", 256, 136},
      {GgmlType::kI8, "i8", 1, 1},             {GgmlType::kI16, "i16", 1, 2},
      {GgmlType::kI32, "i32", 1, 4},           {GgmlType::kI64, "i64", 1, 8},
      {GgmlType::kF64, "f64", 1, 8},           {GgmlType::kIQ1_M, "iq1_m", 256, 56},
      {GgmlType::kBF16, "bf16", 1, 2},
  };
  for (const Expected& e : kExpected) {
    const GgmlTypeTraits traits = GetGgmlTypeTraits(static_cast<uint32_t>(e.type));
    ASSERT_NE(traits.name, nullptr) << e.name;
    EXPECT_STREQ(traits.name, e.name);
    EXPECT_EQ(traits.block_size, e.block_size) << e.name;
    EXPECT_EQ(traits.type_size, e.type_size) << e.name;
  }
  for (uint32_t unknown : {4u, 5u, 31u, 99u, 0xFFFFFFFFu}) {
    EXPECT_EQ(GetGgmlTypeTraits(unknown).name, nullptr) << unknown;
  }
}

TEST(GgufParseTest, EveryScalarType) {
  std::vector<uint8_t> bytes = GgufBuilder()
                                   .Add<uint8_t>("u8", ValueType::kUint8, 200)
                                   .Add<int8_t>("i8", ValueType::kInt8, -100)
                                   .Add<uint16_t>("u16", ValueType::kUint16, 65535)
                                   .Add<int16_t>("i16", ValueType::kInt16, -32768)
                                   .Add<uint32_t>("u32", ValueType::kUint32, 4000000000u)
                                   .Add<int32_t>("i32", ValueType::kInt32, -2000000000)
                                   .Add<float>("f32", ValueType::kFloat32, 0.25f)
                                   .Add<uint8_t>("bool_true", ValueType::kBool, 1)
                                   .Add<uint8_t>("bool_false", ValueType::kBool, 0)
                                   .AddString("string", "hi there")
                                   .Add<uint64_t>("u64", ValueType::kUint64, kU64Max)
                                   .Add<int64_t>("i64", ValueType::kInt64,
                                                 std::numeric_limits<int64_t>::min())
                                   .Add<double>("f64", ValueType::kFloat64, -1.0 / 3)
                                   .Build();
  StatusOr<GgufFile> file = ParseBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();
  ASSERT_EQ(file->metadata().size(), 13u);
  const auto expect = [&](const char* key, ValueType type) -> const Value& {
    static const Value kMissing;
    const Value* v = file->Find(key);
    if (v == nullptr) {
      ADD_FAILURE() << key << " is missing";
      return kMissing;
    }
    EXPECT_EQ(v->type, type) << key;
    return *v;
  };
  EXPECT_EQ(expect("u8", ValueType::kUint8).u, 200u);
  EXPECT_EQ(expect("i8", ValueType::kInt8).i, -100);
  EXPECT_EQ(expect("u16", ValueType::kUint16).u, 65535u);
  EXPECT_EQ(expect("i16", ValueType::kInt16).i, -32768);
  EXPECT_EQ(expect("u32", ValueType::kUint32).u, 4000000000u);
  EXPECT_EQ(expect("i32", ValueType::kInt32).i, -2000000000);
  EXPECT_EQ(expect("f32", ValueType::kFloat32).f, 0.25);
  EXPECT_EQ(expect("bool_true", ValueType::kBool).u, 1u);
  EXPECT_EQ(expect("bool_false", ValueType::kBool).u, 0u);
  EXPECT_EQ(expect("string", ValueType::kString).str, "hi there");
  EXPECT_EQ(expect("u64", ValueType::kUint64).u, kU64Max);
  EXPECT_EQ(expect("i64", ValueType::kInt64).i, std::numeric_limits<int64_t>::min());
  EXPECT_DOUBLE_EQ(expect("f64", ValueType::kFloat64).f, -1.0 / 3);
  EXPECT_TRUE(file->Find("u64")->IsInteger());
  EXPECT_TRUE(file->Find("i8")->IsInteger());
  EXPECT_FALSE(file->Find("bool_true")->IsInteger());
  EXPECT_FALSE(file->Find("f32")->IsInteger());
  EXPECT_TRUE(file->Find("f64")->IsFloat());
  EXPECT_EQ(file->Find("absent"), nullptr);
  // File order is preserved.
  EXPECT_EQ(file->metadata().front().first, "u8");
  EXPECT_EQ(file->metadata().back().first, "f64");
  EXPECT_TRUE(file->tensors().empty());
}

TEST(GgufParseTest, StringArraysAndNestedArrays) {
  Bytes inner;
  inner.Append(ScalarArray<uint32_t>(ValueType::kUint32, {1, 2, 3}))
      .Append(ScalarArray<uint32_t>(ValueType::kUint32, {}))
      .Append(ScalarArray<uint32_t>(ValueType::kUint32, {4}));
  Bytes strings_of_strings;
  strings_of_strings.Append(StringArray({"a", "bc"})).Append(StringArray({""}));
  std::vector<uint8_t> bytes =
      GgufBuilder()
          .AddArray("tokens", StringArray({"<s>", "", "hello world"}))
          .AddArray("nested_u32", ArrayPayload(ValueType::kArray, 3, inner))
          .AddArray("nested_strings", ArrayPayload(ValueType::kArray, 2, strings_of_strings))
          .AddArray("empty", ScalarArray<float>(ValueType::kFloat32, {}))
          .AddArray("bools", ScalarArray<uint8_t>(ValueType::kBool, {1, 0}))
          .Build();
  StatusOr<GgufFile> file = ParseBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();

  const Value* tokens = file->Find("tokens");
  ASSERT_NE(tokens, nullptr);
  EXPECT_EQ(tokens->type, ValueType::kArray);
  EXPECT_EQ(tokens->elem_type, ValueType::kString);
  ASSERT_EQ(tokens->array.size(), 3u);
  EXPECT_EQ(tokens->array[0].str, "<s>");
  EXPECT_EQ(tokens->array[1].str, "");
  EXPECT_EQ(tokens->array[2].str, "hello world");

  const Value* nested = file->Find("nested_u32");
  ASSERT_NE(nested, nullptr);
  EXPECT_EQ(nested->elem_type, ValueType::kArray);
  ASSERT_EQ(nested->array.size(), 3u);
  EXPECT_EQ(nested->array[0].elem_type, ValueType::kUint32);
  ASSERT_EQ(nested->array[0].array.size(), 3u);
  EXPECT_EQ(nested->array[0].array[2].u, 3u);
  EXPECT_TRUE(nested->array[1].array.empty());
  EXPECT_EQ(nested->array[2].array[0].u, 4u);

  const Value* nested_strings = file->Find("nested_strings");
  ASSERT_NE(nested_strings, nullptr);
  ASSERT_EQ(nested_strings->array.size(), 2u);
  EXPECT_EQ(nested_strings->array[0].array[1].str, "bc");
  EXPECT_EQ(nested_strings->array[1].array[0].str, "");

  EXPECT_EQ(file->Find("empty")->elem_type, ValueType::kFloat32);
  EXPECT_TRUE(file->Find("empty")->array.empty());
  EXPECT_EQ(file->Find("bools")->array[0].type, ValueType::kBool);
  EXPECT_EQ(file->Find("bools")->array[0].u, 1u);
}

TEST(GgufParseTest, NestingUpToTheLimitIsAccepted) {
  Bytes value = ScalarArray<uint8_t>(ValueType::kUint8, {7});
  for (int level = 1; level < kMaxArrayNesting; ++level) {
    value = ArrayPayload(ValueType::kArray, 1, value);
  }
  StatusOr<GgufFile> file = ParseBytes(GgufBuilder().AddArray("deep", value).Build());
  ASSERT_TRUE(file.ok()) << file.status().message();
  const Value* v = file->Find("deep");
  for (int level = 1; level < kMaxArrayNesting; ++level) v = &v->array[0];
  EXPECT_EQ(v->array[0].u, 7u);
}

TEST(GgufParseTest, Versions2And3) {
  for (uint32_t version : {2u, 3u}) {
    GgufBuilder builder(version);
    builder.AddString("general.architecture", "llama").AddTensor("w", {32}, GgmlType::kF32);
    StatusOr<GgufFile> file = ParseBytes(builder.Build());
    ASSERT_TRUE(file.ok()) << file.status().message();
    EXPECT_EQ(file->version(), version);
    EXPECT_EQ(file->alignment(), 32u);
    EXPECT_EQ(file->GetString("general.architecture").value(), "llama");
    ASSERT_EQ(file->tensors().size(), 1u);
  }
}

TEST(GgufParseTest, TypedGetters) {
  std::vector<uint8_t> bytes = GgufBuilder()
                                   .Add<uint8_t>("u8", ValueType::kUint8, 7)
                                   .Add<uint64_t>("u64", ValueType::kUint64, 1ULL << 50)
                                   .Add<int32_t>("i32", ValueType::kInt32, 12)
                                   .Add<int32_t>("negative", ValueType::kInt32, -3)
                                   .Add<float>("f32", ValueType::kFloat32, 1.5f)
                                   .Add<double>("f64", ValueType::kFloat64, 2.25)
                                   .AddString("name", "tiny")
                                   .Add<uint8_t>("flag", ValueType::kBool, 1)
                                   .Build();
  StatusOr<GgufFile> file = ParseBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();

  EXPECT_EQ(file->GetUint("u8").value(), 7u);
  EXPECT_EQ(file->GetUint("u64").value(), 1ULL << 50);
  EXPECT_EQ(file->GetUint("i32").value(), 12u);
  EXPECT_EQ(file->GetUint("u8", 99).value(), 7u);
  EXPECT_EQ(file->GetUint("absent", 99).value(), 99u);
  ExpectError(file->GetUint("absent"), "metadata key 'absent' is missing");
  ExpectError(file->GetUint("negative"), "'negative' is -3");
  ExpectError(file->GetUint("name"), "metadata key 'name' has type string");
  ExpectError(file->GetUint("flag", 1), "'flag' has type bool");
  ExpectError(file->GetUint("f32"), "'f32' has type f32");

  EXPECT_EQ(file->GetFloat("f32").value(), 1.5);
  EXPECT_EQ(file->GetFloat("f64").value(), 2.25);
  EXPECT_EQ(file->GetFloat("u8").value(), 7.0);
  EXPECT_EQ(file->GetFloat("negative").value(), -3.0);
  EXPECT_EQ(file->GetFloat("absent", 0.5).value(), 0.5);
  EXPECT_EQ(file->GetFloat("f32", 0.5).value(), 1.5);
  ExpectError(file->GetFloat("absent"), "'absent' is missing");
  ExpectError(file->GetFloat("name", 1.0), "metadata key 'name' has type string");

  EXPECT_EQ(file->GetString("name").value(), "tiny");
  ExpectError(file->GetString("absent"), "'absent' is missing");
  ExpectError(file->GetString("u8"), "metadata key 'u8' has type u8, expected string");

  EXPECT_TRUE(file->GetBool("flag", false).value());
  EXPECT_FALSE(file->GetBool("absent", false).value());
  EXPECT_TRUE(file->GetBool("absent", true).value());
  ExpectError(file->GetBool("u8", false), "metadata key 'u8' has type u8, expected bool");
}

TEST(GgufParseTest, TensorInfosPointIntoTheBuffer) {
  GgufBuilder builder;
  builder.AddString("general.architecture", "llama")
      .AddTensor("token_embd.weight", {64, 3}, GgmlType::kF32)
      .AddTensor("blk.0.attn_q.weight", {64, 2}, GgmlType::kQ4_0)
      .AddTensor("blk.0.ffn_down.weight", {512, 3, 2}, GgmlType::kQ6_K)
      .AddTensor("norm", {5}, GgmlType::kF16);
  const std::vector<uint8_t> bytes = builder.Build();
  StatusOr<GgufFile> file = ParseBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->data_offset(), builder.data_offset());
  EXPECT_EQ(file->data_offset() % 32, 0u);
  EXPECT_EQ(file->file_size(), bytes.size());
  ASSERT_EQ(file->tensors().size(), 4u);

  const TensorInfo& embd = file->tensors()[0];
  EXPECT_EQ(embd.name, "token_embd.weight");
  EXPECT_EQ(embd.n_dims, 2u);
  EXPECT_EQ(embd.ne[0], 64u);
  EXPECT_EQ(embd.ne[1], 3u);
  EXPECT_EQ(embd.ne[2], 1u);
  EXPECT_EQ(embd.ne[3], 1u);
  EXPECT_EQ(embd.type, GgmlType::kF32);
  EXPECT_EQ(embd.n_elements, 192u);
  EXPECT_EQ(embd.n_bytes, 768u);

  const TensorInfo& q = file->tensors()[1];
  EXPECT_EQ(q.type, GgmlType::kQ4_0);
  EXPECT_EQ(q.n_elements, 128u);
  EXPECT_EQ(q.n_bytes, 4u * 18);

  const TensorInfo& down = file->tensors()[2];
  EXPECT_EQ(down.n_dims, 3u);
  EXPECT_EQ(down.ne[2], 2u);
  EXPECT_EQ(down.n_elements, 3072u);
  EXPECT_EQ(down.n_bytes, 12u * 210);

  EXPECT_EQ(file->tensors()[3].n_bytes, 10u);

  for (size_t t = 0; t < file->tensors().size(); ++t) {
    const TensorInfo& info = file->tensors()[t];
    EXPECT_EQ(info.offset, builder.offset(t));
    EXPECT_EQ(info.offset % 32, 0u);
    const auto* data = static_cast<const uint8_t*>(info.data);
    EXPECT_EQ(data, bytes.data() + builder.data_offset() + info.offset) << info.name;
    EXPECT_LE(data + info.n_bytes, bytes.data() + bytes.size());
    EXPECT_EQ(data[0], PatternByte(t, 0));
    EXPECT_EQ(data[info.n_bytes - 1], PatternByte(t, info.n_bytes - 1));
    EXPECT_EQ(file->FindTensor(info.name), &info);
  }
  EXPECT_EQ(file->FindTensor("missing"), nullptr);
}

TEST(GgufParseTest, CustomAlignment) {
  for (uint32_t alignment : {1u, 8u, 64u, 4096u}) {
    GgufBuilder builder;
    builder.Alignment(alignment)
        .AddTensor("a", {3}, GgmlType::kF32)
        .AddTensor("b", {5}, GgmlType::kF16)
        .AddTensor("c", {7}, GgmlType::kI8);
    const std::vector<uint8_t> bytes = builder.Build();
    StatusOr<GgufFile> file = ParseBytes(bytes);
    ASSERT_TRUE(file.ok()) << alignment << ": " << file.status().message();
    EXPECT_EQ(file->alignment(), alignment);
    EXPECT_EQ(file->data_offset() % alignment, 0u);
    EXPECT_EQ(file->data_offset(), builder.data_offset());
    for (size_t t = 0; t < 3; ++t) {
      const TensorInfo& info = file->tensors()[t];
      EXPECT_EQ(info.offset % alignment, 0u);
      EXPECT_EQ(static_cast<const uint8_t*>(info.data),
                bytes.data() + builder.data_offset() + builder.offset(t));
    }
  }
}

TEST(GgufParseTest, MetadataOnlyFileNeedsNoDataSection) {
  // Ends right after the last value, with no padding to the alignment.
  std::vector<uint8_t> bytes = GgufBuilder().Add<uint8_t>("x", ValueType::kUint8, 1).Build();
  StatusOr<GgufFile> file = ParseBytes(bytes);
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_TRUE(file->tensors().empty());
}

TEST(GgufParseTest, ZeroSizedTensorIsAccepted) {
  GgufBuilder builder;
  builder.AddTensor("empty", {0, 4}, GgmlType::kF32).AddTensor("w", {8}, GgmlType::kF32);
  StatusOr<GgufFile> file = ParseBytes(builder.Build());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->tensors()[0].n_elements, 0u);
  EXPECT_EQ(file->tensors()[0].n_bytes, 0u);
}

TEST(ValueToStringTest, Scalars) {
  Value v;
  v.type = ValueType::kUint32;
  v.u = 4096;
  EXPECT_EQ(v.ToString(), "4096");
  v.type = ValueType::kInt64;
  v.i = -42;
  EXPECT_EQ(v.ToString(), "-42");
  v.type = ValueType::kFloat32;
  v.f = 0.1f;  // shortest float rendering, not the widened double's digits
  EXPECT_EQ(v.ToString(), "0.1");
  v.type = ValueType::kFloat64;
  v.f = 1e-5;
  EXPECT_EQ(v.ToString(), "1e-05");
  v.type = ValueType::kBool;
  v.u = 1;
  EXPECT_EQ(v.ToString(), "true");
  v.u = 0;
  EXPECT_EQ(v.ToString(), "false");
}

TEST(ValueToStringTest, StringsAreQuotedEscapedAndCut) {
  Value v;
  v.type = ValueType::kString;
  v.str = "say \"hi\"\n\tnow\x01";
  EXPECT_EQ(v.ToString(), R"("say \"hi\"\n\tnow\x01")");
  v.str = "\xe2\x96\x81the";  // UTF-8 passes through
  EXPECT_EQ(v.ToString(), "\"\xe2\x96\x81the\"");
  v.str = std::string(1000, 'x');
  const std::string rendered = v.ToString();
  EXPECT_LT(rendered.size(), 300u);
  EXPECT_NE(rendered.find("(1000 bytes)"), std::string::npos) << rendered;
}

TEST(ValueToStringTest, ArraysAreAbbreviated) {
  Value array;
  array.type = ValueType::kArray;
  array.elem_type = ValueType::kString;
  for (const char* s : {"a", "b", "c"}) {
    Value e;
    e.type = ValueType::kString;
    e.str = s;
    array.array.push_back(e);
  }
  EXPECT_EQ(array.ToString(), R"(["a", "b", "c"])");
  EXPECT_EQ(array.ToString(2), R"([3 × string] ["a", "b", ...])");
  EXPECT_EQ(array.ToString(0), "[3 × string] [...]");

  Value empty;
  empty.type = ValueType::kArray;
  empty.elem_type = ValueType::kUint32;
  EXPECT_EQ(empty.ToString(), "[]");

  Value nested;
  nested.type = ValueType::kArray;
  nested.elem_type = ValueType::kArray;
  nested.array = {array, empty};
  EXPECT_EQ(nested.ToString(2), R"([[3 × string] ["a", "b", ...], []])");
}

StatusOr<GgufFile> ParseWithKv(const Bytes& payload, ValueType type) {
  return ParseBytes(GgufBuilder()
                        .Add<uint8_t>("k0", ValueType::kUint8, 0)
                        .Add<uint8_t>("k1", ValueType::kUint8, 1)
                        .Add<uint8_t>("k2", ValueType::kUint8, 2)
                        .AddRaw("bad.key", type, payload)
                        .Build());
}

TEST(GgufErrorTest, EmptyBuffer) {
  ExpectError(GgufFile::Parse(nullptr, 0), "gguf: file is empty");
}

TEST(GgufErrorTest, BadMagic) {
  std::vector<uint8_t> bytes = GgufBuilder().Build();
  bytes[3] = 'X';
  ExpectParseError(bytes, "gguf: bad magic");
  ExpectParseError({'G', 'X'}, "gguf: bad magic");
}

TEST(GgufErrorTest, TruncatedHeader) {
  ExpectParseError({'G', 'G', 'U'}, "gguf: truncated header");
  std::vector<uint8_t> bytes = GgufBuilder().Build();
  bytes.resize(20);
  ExpectParseError(bytes, "gguf: truncated header: the file is 20 bytes");
}

TEST(GgufErrorTest, UnsupportedVersions) {
  for (uint32_t version : {0u, 1u, 4u, 7u}) {
    ExpectParseError(GgufBuilder(version).Build(),
                     "gguf: unsupported version " + std::to_string(version));
  }
  ExpectParseError(GgufBuilder(0x03000000).Build(), "big-endian");
}

TEST(GgufErrorTest, KeyStringLengthExceedsFile) {
  std::vector<uint8_t> bytes = GgufBuilder()
                                   .Add<uint8_t>("k0", ValueType::kUint8, 0)
                                   .Add<uint8_t>("k1", ValueType::kUint8, 1)
                                   .Add<uint8_t>("k2", ValueType::kUint8, 2)
                                   .Add<uint8_t>("k3", ValueType::kUint8, 3)
                                   .Build();
  // Each pair is 8 (length) + 2 (key) + 4 (type) + 1 (value) bytes after the 24-byte header.
  PatchAt<uint64_t>(bytes, 24 + 3 * 15, kU64Max);
  ExpectParseError(bytes,
                   "gguf: metadata key #3: string length 18446744073709551615 exceeds file size");
}

TEST(GgufErrorTest, ValueStringLengthExceedsFile) {
  Bytes payload;
  payload.Put<uint64_t>(1000).Put<uint8_t>('x');
  ExpectError(ParseWithKv(payload, ValueType::kString),
              "gguf: metadata key #3 'bad.key': string length 1000 exceeds file size");
}

TEST(GgufErrorTest, TruncatedScalarNamesOffset) {
  Bytes payload;
  payload.Put<uint16_t>(1);
  ExpectError(ParseWithKv(payload, ValueType::kUint32),
              "gguf: metadata key #3 'bad.key': u32 at offset");
}

TEST(GgufErrorTest, CountsExceedingTheFileAllocateNothing) {
  std::vector<uint8_t> bytes = GgufBuilder().Add<uint8_t>("k", ValueType::kUint8, 0).Build();
  PatchAt<uint64_t>(bytes, 16, 4000000000);
  ExpectParseError(bytes, "gguf: n_kv 4000000000 exceeds what the file can hold");
  PatchAt<uint64_t>(bytes, 16, 1ULL << 60);
  ExpectParseError(bytes, "gguf: n_kv 1152921504606846976 exceeds what the file can hold");

  bytes = GgufBuilder().AddTensor("w", {32}, GgmlType::kF32).Build();
  PatchAt<uint64_t>(bytes, 8, 1ULL << 60);
  ExpectParseError(bytes, "gguf: n_tensors 1152921504606846976 exceeds what the file can hold");
}

TEST(GgufErrorTest, ArrayCountExceedsFile) {
  ExpectError(ParseWithKv(ArrayPayload(ValueType::kUint64, 1ULL << 60, Bytes()),
                          ValueType::kArray),
              "gguf: metadata key #3 'bad.key': array of 1152921504606846976 u64 exceeds what "
              "the file can hold");
  // An array element's failure names the element.
  Bytes strings;
  strings.PutString("ok").Put<uint64_t>(kU64Max);
  ExpectError(ParseWithKv(ArrayPayload(ValueType::kString, 2, strings), ValueType::kArray),
              "'bad.key': element 1: string length 18446744073709551615 exceeds file size");
}

TEST(GgufErrorTest, TooManyMetadataValues) {
  // The count fits in the file but would cost ~100 bytes of memory per one-byte element.
  std::vector<uint8_t> bytes =
      GgufBuilder().AddArray("huge", ArrayPayload(ValueType::kUint8, 1 << 24, Bytes())).Build();
  bytes.resize(bytes.size() + (1 << 24));
  ExpectParseError(bytes, "gguf: metadata key #0 'huge': metadata holds more than 16777216 values");
}

TEST(GgufErrorTest, UnknownValueTypes) {
  Bytes payload;
  payload.Put<uint32_t>(0);
  ExpectError(ParseBytes(GgufBuilder().AddRaw("weird", 13u, payload).Build()),
              "gguf: metadata key #0 'weird': unknown value type 13");
  ExpectError(ParseWithKv(ArrayPayload(static_cast<ValueType>(42), 0, Bytes()),
                          ValueType::kArray),
              "'bad.key': unknown array element type 42");
}

TEST(GgufErrorTest, BoolMustBeZeroOrOne) {
  Bytes payload;
  payload.Put<uint8_t>(2);
  ExpectError(ParseWithKv(payload, ValueType::kBool), "'bad.key': bool value 2");
}

TEST(GgufErrorTest, DuplicateKey) {
  ExpectParseError(GgufBuilder()
                       .Add<uint8_t>("a", ValueType::kUint8, 0)
                       .Add<uint8_t>("b", ValueType::kUint8, 0)
                       .Add<uint32_t>("a", ValueType::kUint32, 0)
                       .Build(),
                   "gguf: metadata key #2 'a': duplicate key");
}

TEST(GgufErrorTest, NestingTooDeep) {
  Bytes value = ScalarArray<uint8_t>(ValueType::kUint8, {});
  for (int level = 1; level <= kMaxArrayNesting; ++level) {
    value = ArrayPayload(ValueType::kArray, 1, value);
  }
  ExpectParseError(GgufBuilder().AddArray("deep", value).Build(),
                   "'deep': element 0: element 0: element 0: element 0: element 0: element 0: "
                   "element 0: element 0: arrays nest deeper than 8 levels");
  // Far deeper than any stack should be asked to go.
  Bytes very_deep;
  for (int level = 0; level < 10000; ++level) {
    very_deep.Put(static_cast<uint32_t>(ValueType::kArray)).Put<uint64_t>(1);
  }
  very_deep.Put(static_cast<uint32_t>(ValueType::kUint8)).Put<uint64_t>(0);
  ExpectParseError(GgufBuilder().AddArray("deep", very_deep).Build(), "arrays nest deeper");
}

TEST(GgufErrorTest, BadAlignment) {
  ExpectParseError(GgufBuilder().Add<uint32_t>("general.alignment", ValueType::kUint32, 0).Build(),
                   "gguf: general.alignment 0 is not a non-zero power of two");
  ExpectParseError(GgufBuilder().Add<uint32_t>("general.alignment", ValueType::kUint32, 48).Build(),
                   "gguf: general.alignment 48 is not a non-zero power of two");
  ExpectParseError(GgufBuilder().Add<uint64_t>("general.alignment", ValueType::kUint64, 64).Build(),
                   "gguf: general.alignment has type u64, expected u32");
}

TEST(GgufErrorTest, BadDimensionCount) {
  ExpectParseError(GgufBuilder().AddTensor("x", {}, 0u, 0).Build(),
                   "gguf: tensor 'x': n_dims 0 is not in 1..4");
  ExpectParseError(GgufBuilder().AddTensor("x", {1, 1, 1, 1, 1}, 0u, 0).Build(),
                   "gguf: tensor 'x': n_dims 5 is not in 1..4");
}

TEST(GgufErrorTest, UnknownTensorType) {
  ExpectParseError(GgufBuilder().AddTensor("x", {32}, 99u, 0).Build(),
                   "gguf: tensor 'x': unknown type 99");
  ExpectParseError(GgufBuilder().AddTensor("x", {32}, 4u, 0).Build(),
                   "gguf: tensor 'x': unknown type 4");
}

TEST(GgufErrorTest, DimensionProductOverflows) {
  constexpr auto kF32 = static_cast<uint32_t>(GgmlType::kF32);
  ExpectParseError(GgufBuilder().AddTensor("x", {1ULL << 32, 1ULL << 32}, kF32, 0, 0).Build(),
                   "gguf: tensor 'x': dimension product overflows");
  ExpectParseError(GgufBuilder().AddTensor("x", {kU64Max}, kF32, 0, 0).Build(),
                   "gguf: tensor 'x': dimension product overflows");
  // The element count fits but the byte count does not.
  ExpectParseError(GgufBuilder().AddTensor("x", {1ULL << 62}, kF32, 0, 0).Build(),
                   "gguf: tensor 'x': byte size overflows");
}

TEST(GgufErrorTest, RowNotMultipleOfBlockSize) {
  ExpectParseError(GgufBuilder().AddTensor("x", {48, 2}, static_cast<uint32_t>(GgmlType::kQ8_0),
                                           0, 0)
                       .Build(),
                   "gguf: tensor 'x': ne[0] = 48 is not a multiple of the q8_0 block size 32");
}

TEST(GgufErrorTest, MisalignedOffset) {
  ExpectParseError(GgufBuilder()
                       .AddTensor("a", {32}, static_cast<uint32_t>(GgmlType::kF32), 0)
                       .AddTensor("b", {32}, static_cast<uint32_t>(GgmlType::kF32), 136)
                       .Build(),
                   "gguf: tensor 'b': offset 136 is not a multiple of the alignment 32");
}

TEST(GgufErrorTest, DuplicateTensorName) {
  ExpectParseError(GgufBuilder()
                       .AddTensor("w", {8}, GgmlType::kF32)
                       .AddTensor("v", {8}, GgmlType::kF32)
                       .AddTensor("w", {8}, GgmlType::kF32)
                       .Build(),
                   "gguf: tensor #2 'w': duplicate name");
}

TEST(GgufErrorTest, DataOutsideTheFile) {
  GgufBuilder builder;
  builder.AddTensor("blk.0.attn_q.weight", {64}, GgmlType::kF32);
  std::vector<uint8_t> bytes = builder.Build();
  bytes.pop_back();
  ExpectParseError(bytes, "gguf: tensor 'blk.0.attn_q.weight': data [0, +256 bytes) lies "
                          "outside the file");
  // An offset near 2^64 must not wrap around into the file.
  ExpectParseError(GgufBuilder()
                       .AddTensor("a", {8}, GgmlType::kF32)
                       .AddTensor("b", {8}, static_cast<uint32_t>(GgmlType::kF32),
                                  kU64Max - 31)
                       .Build(),
                   "gguf: tensor 'b': data [18446744073709551584, +32 bytes) lies outside");
}

TEST(GgufErrorTest, OverlappingTensors) {
  ExpectParseError(GgufBuilder()
                       .AddTensor("a", {64}, GgmlType::kF32)
                       .AddTensor("b", {8}, static_cast<uint32_t>(GgmlType::kF32), 128)
                       .Build(),
                   "gguf: tensors 'a' and 'b' overlap");
}

TEST(GgufErrorTest, GarbageNamesAreEscapedAndCut) {
  std::vector<uint8_t> bytes =
      GgufBuilder().AddTensor("\x01" + std::string(200, 'n'), {8}, 99u, 0).Build();
  StatusOr<GgufFile> file = ParseBytes(bytes);
  ExpectError(file, "gguf: tensor '\\x01nnn");
  EXPECT_NE(file.status().message().find("n...': unknown type 99"), std::string::npos)
      << file.status().message();
  EXPECT_LT(file.status().message().size(), 120u) << file.status().message();
}

// A file under the test temp directory, removed when the test ends.
class TempFile {
 public:
  explicit TempFile(const std::vector<uint8_t>& bytes) {
    const auto* test = testing::UnitTest::GetInstance()->current_test_info();
    path_ = (std::filesystem::temp_directory_path() /
             (std::string("kvllm_gguf_") + test->name() + "_" + std::to_string(::getpid()) +
              ".gguf"))
                .string();
    std::ofstream out(path_, std::ios::binary | std::ios::trunc);
    out.write(reinterpret_cast<const char*>(bytes.data()),
              static_cast<std::streamsize>(bytes.size()));
  }
  ~TempFile() { std::filesystem::remove(path_); }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(GgufOpenTest, MapsARealFile) {
  GgufBuilder builder = RichBuilder();
  const std::vector<uint8_t> bytes = builder.Build();
  TempFile temp(bytes);
  StatusOr<GgufFile> file = GgufFile::Open(temp.path());
  ASSERT_TRUE(file.ok()) << file.status().message();
  EXPECT_EQ(file->path(), temp.path());
  EXPECT_EQ(file->file_size(), bytes.size());
  EXPECT_EQ(file->GetString("general.name").value(), "tiny test model");
  ASSERT_EQ(file->tensors().size(), 4u);
  // The data lives in a page-aligned mapping of the file, not in a copy of it.
  const auto* base = static_cast<const uint8_t*>(file->tensors()[0].data) -
                     builder.data_offset() - builder.offset(0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE)),
            0u);
  EXPECT_EQ(std::memcmp(base, bytes.data(), bytes.size()), 0);
  for (size_t t = 0; t < file->tensors().size(); ++t) {
    const TensorInfo& info = file->tensors()[t];
    const auto* data = static_cast<const uint8_t*>(info.data);
    EXPECT_EQ(data, base + builder.data_offset() + builder.offset(t));
    EXPECT_LE(data + info.n_bytes, base + file->file_size());
    EXPECT_EQ(data[info.n_bytes - 1], PatternByte(t, info.n_bytes - 1));
  }
}

TEST(GgufOpenTest, MovesKeepTheMapping) {
  TempFile temp(RichBuilder().Build());
  StatusOr<GgufFile> opened = GgufFile::Open(temp.path());
  ASSERT_TRUE(opened.ok()) << opened.status().message();
  GgufFile file = std::move(opened).value();
  const void* data = file.FindTensor("output_norm.weight")->data;

  GgufFile moved(std::move(file));
  EXPECT_EQ(moved.FindTensor("output_norm.weight")->data, data);
  EXPECT_EQ(static_cast<const uint8_t*>(data)[0], PatternByte(3, 0));

  // Assigning over an open file releases its mapping and takes the other's.
  StatusOr<GgufFile> other = GgufFile::Open(temp.path());
  ASSERT_TRUE(other.ok()) << other.status().message();
  moved = std::move(other).value();
  const TensorInfo* norm = moved.FindTensor("output_norm.weight");
  ASSERT_NE(norm, nullptr);
  EXPECT_NE(norm->data, data);
  EXPECT_EQ(static_cast<const uint8_t*>(norm->data)[1], PatternByte(3, 1));
  EXPECT_EQ(moved.GetUint("llama.context_length").value(), 2048u);
}

// --no-mmap: the same file, read into memory that starts on a 2 MiB boundary (where a
// transparent huge page can back it), gives the same metadata and tensor bytes.
TEST(GgufOpenTest, ReadModeHoldsTheSameBytesInHugePageAlignedMemory) {
  GgufBuilder builder = RichBuilder(/*rows=*/3);
  const std::vector<uint8_t> bytes = builder.Build();
  TempFile temp(bytes);
  StatusOr<GgufFile> mapped = GgufFile::Open(temp.path(), LoadMode::kMmap);
  StatusOr<GgufFile> read = GgufFile::Open(temp.path(), LoadMode::kRead);
  ASSERT_TRUE(mapped.ok()) << mapped.status().message();
  ASSERT_TRUE(read.ok()) << read.status().message();
  EXPECT_EQ(read->file_size(), bytes.size());
  EXPECT_EQ(read->GetString("general.name").value(), "tiny test model");
  ASSERT_EQ(read->tensors().size(), mapped->tensors().size());
  const auto* base = static_cast<const uint8_t*>(read->tensors()[0].data) -
                     builder.data_offset() - builder.offset(0);
  EXPECT_EQ(reinterpret_cast<uintptr_t>(base) % (uintptr_t{2} << 20), 0u);
  EXPECT_EQ(std::memcmp(base, bytes.data(), bytes.size()), 0);
  for (size_t t = 0; t < read->tensors().size(); ++t) {
    const TensorInfo& a = read->tensors()[t];
    const TensorInfo& b = mapped->tensors()[t];
    EXPECT_NE(a.data, b.data) << "a copy, not the file mapping";
    ASSERT_EQ(a.n_bytes, b.n_bytes);
    EXPECT_EQ(std::memcmp(a.data, b.data, a.n_bytes), 0) << a.name;
  }
  // Moves hand the memory over; the moved-to file still reads it after the source is gone.
  const void* norm = read->FindTensor("output_norm.weight")->data;
  GgufFile moved(std::move(read).value());
  EXPECT_EQ(moved.FindTensor("output_norm.weight")->data, norm);
  EXPECT_EQ(static_cast<const uint8_t*>(norm)[1], PatternByte(3, 1));
}

// Discard gives back the pages wholly inside a tensor and nothing else: a mapped file reads
// them from the file again, memory read with --no-mmap reads zeros there, and a caller's
// buffer is left alone.
TEST(GgufOpenTest, DiscardReleasesOnlyWholePagesOfTheRange) {
  GgufBuilder builder = RichBuilder(/*rows=*/64);  // token_embd: 16 KiB of f32
  const std::vector<uint8_t> bytes = builder.Build();
  TempFile temp(bytes);
  const auto page = static_cast<uintptr_t>(::sysconf(_SC_PAGESIZE));
  for (LoadMode mode : {LoadMode::kMmap, LoadMode::kRead}) {
    StatusOr<GgufFile> file = GgufFile::Open(temp.path(), mode);
    ASSERT_TRUE(file.ok()) << file.status().message();
    const TensorInfo& embd = *file->FindTensor("token_embd.weight");
    const std::vector<uint8_t> before(static_cast<const uint8_t*>(embd.data),
                                      static_cast<const uint8_t*>(embd.data) + embd.n_bytes);
    const TensorInfo& q = *file->FindTensor("blk.0.attn_q.weight");
    const std::vector<uint8_t> other(static_cast<const uint8_t*>(q.data),
                                     static_cast<const uint8_t*>(q.data) + q.n_bytes);
    // The tensor without its first byte, so that the range starts off a page boundary.
    const auto* start = static_cast<const uint8_t*>(embd.data) + 1;
    file->Discard(start, embd.n_bytes - 1);
    const uintptr_t first = (reinterpret_cast<uintptr_t>(start) + page - 1) / page * page;
    const uintptr_t last = (reinterpret_cast<uintptr_t>(start) + embd.n_bytes - 1) / page * page;
    ASSERT_LT(first, last);
    const auto* data = static_cast<const uint8_t*>(embd.data);
    for (size_t i = 0; i < embd.n_bytes; ++i) {
      const auto at = reinterpret_cast<uintptr_t>(data + i);
      const bool released = at >= first && at < last;
      const uint8_t want = mode == LoadMode::kRead && released ? 0 : before[i];
      ASSERT_EQ(data[i], want) << "byte " << i << (released ? " (released)" : "");
    }
    EXPECT_EQ(std::memcmp(q.data, other.data(), other.size()), 0);
  }
  StatusOr<GgufFile> parsed = GgufFile::Parse(bytes.data(), bytes.size());
  ASSERT_TRUE(parsed.ok());
  const TensorInfo& embd = *parsed->FindTensor("token_embd.weight");
  parsed->Discard(embd.data, embd.n_bytes);
  EXPECT_EQ(std::memcmp(bytes.data() + builder.data_offset() + builder.offset(0), embd.data,
                        embd.n_bytes),
            0);
}

TEST(GgufOpenTest, ReadModeReportsTheSameErrors) {
  const std::string missing = "/nonexistent/kvllm/model.gguf";
  ExpectError(GgufFile::Open(missing, LoadMode::kRead),
              "gguf: cannot open '" + missing + "': " + std::strerror(ENOENT));
  TempFile empty({});
  ExpectError(GgufFile::Open(empty.path(), LoadMode::kRead), "is empty");
  const std::vector<uint8_t> bytes = RichBuilder().Build();
  TempFile truncated(std::vector<uint8_t>(bytes.begin(), bytes.end() - 1));
  StatusOr<GgufFile> file = GgufFile::Open(truncated.path(), LoadMode::kRead);
  ASSERT_FALSE(file.ok());
  EXPECT_NE(file.status().message().find("(in '" + truncated.path() + "')"), std::string::npos)
      << file.status().message();
}

TEST(GgufOpenTest, MissingFile) {
  const std::string path = "/nonexistent/kvllm/model.gguf";
  ExpectError(GgufFile::Open(path), "gguf: cannot open '" + path + "': " + std::strerror(ENOENT));
}

TEST(GgufOpenTest, EmptyFile) {
  TempFile temp({});
  ExpectError(GgufFile::Open(temp.path()), "gguf: '" + temp.path() + "' is empty");
}

TEST(GgufOpenTest, Directory) {
  ExpectError(GgufFile::Open(std::filesystem::temp_directory_path().string()),
              "is not a regular file");
}

TEST(GgufOpenTest, ParseErrorsNameThePath) {
  TempFile temp(GgufBuilder(1).Build());
  ExpectError(GgufFile::Open(temp.path()),
              "gguf: unsupported version 1; kvllm reads versions 2 and 3 (in '" + temp.path() +
                  "')");
}

TEST(GgufRobustnessTest, EveryTruncationFails) {
  const std::vector<uint8_t> bytes = RichBuilder(/*rows=*/3).Build();
  ASSERT_GT(bytes.size(), 2000u);
  ASSERT_TRUE(ParseBytes(bytes).ok());
  for (size_t size = 0; size < bytes.size(); ++size) {
    // An exact-size heap copy, so that AddressSanitizer flags any read past its end.
    const std::vector<uint8_t> truncated(bytes.begin(), bytes.begin() + size);
    StatusOr<GgufFile> file = ParseBytes(truncated);
    ASSERT_FALSE(file.ok()) << "truncated to " << size << " bytes";
    ASSERT_EQ(file.status().message().rfind("gguf: ", 0), 0u) << file.status().message();
  }
}

TEST(GgufRobustnessTest, RandomMutationsParseOrFail) {
  GgufBuilder builder = RichBuilder(/*rows=*/1);
  const std::vector<uint8_t> original = builder.Build();
  const std::vector<size_t>& u64_fields = builder.u64_positions();
  ASSERT_GT(u64_fields.size(), 40u);
  constexpr uint64_t kSpecialValues[] = {kU64Max,    1ULL << 63, 1ULL << 32, 0xFFFFFFFF,
                                         1ULL << 60, 0,          1,          4096};
  std::mt19937_64 rng(20240611);
  int parsed = 0;
  size_t rendered_bytes = 0;
  for (int iteration = 0; iteration < 20000; ++iteration) {
    std::vector<uint8_t> bytes = original;  // exact size, as above
    const int n_mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < n_mutations; ++m) {
      const size_t pos = rng() % bytes.size();
      switch (rng() % 6) {
        case 0: bytes[pos] ^= static_cast<uint8_t>(1u << (rng() % 8)); break;
        case 1: bytes[pos] = 0x00; break;
        case 2: bytes[pos] = 0xFF; break;
        case 3: bytes[pos] = 0x7F; break;
        case 4: {  // a length, count, dimension or offset set to something extreme
          const size_t field = u64_fields[rng() % u64_fields.size()];
          uint64_t value = kSpecialValues[rng() % std::size(kSpecialValues)];
          if (rng() % 4 == 0) value = bytes.size() + rng() % 64;
          std::memcpy(bytes.data() + field, &value, sizeof(value));
          break;
        }
        default: {  // a u64 written anywhere, unaligned
          const uint64_t value = kSpecialValues[rng() % std::size(kSpecialValues)];
          std::memcpy(bytes.data() + rng() % (bytes.size() - 7), &value, sizeof(value));
          break;
        }
      }
    }
    StatusOr<GgufFile> file = ParseBytes(bytes);
    if (!file.ok()) {
      ASSERT_EQ(file.status().message().rfind("gguf: ", 0), 0u) << file.status().message();
      continue;
    }
    ++parsed;
    // Whatever parses is consistent: every tensor's data lies inside the buffer.
    for (const TensorInfo& info : file->tensors()) {
      const auto* data = static_cast<const uint8_t*>(info.data);
      ASSERT_GE(data, bytes.data()) << info.name;
      ASSERT_LE(info.n_bytes, static_cast<size_t>(bytes.data() + bytes.size() - data))
          << info.name;
    }
    for (const auto& [key, value] : file->metadata()) rendered_bytes += value.ToString().size();
  }
  EXPECT_GT(parsed, 0);
  EXPECT_GT(rendered_bytes, 0u);
}

}  // namespace
}  // namespace kvllm::gguf
