// The GGUF reader against gguf-py (tests/fixtures/make_gguf_fixtures.py): every metadata value
// type read as GGUFReader reads it, every ggml block type ptrain reads dequantized bit for bit as
// gguf-py's quants.dequantize does, the writer's files read back; and damaged files — every
// truncation of the header, each kind of corrupt field — refused by name without reading past
// the end (also run under AddressSanitizer: asan.file_readers).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/gguf.h"
#include "checkpoint/gguf_reader.h"
#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "test_util.h"

using namespace ptrain;

namespace {

std::vector<uint8_t> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_bytes(const std::string& path, const std::vector<uint8_t>& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
}

// A GGUF byte builder for damaged files.
struct Builder {
  std::vector<uint8_t> b;
  template <typename T>
  Builder& put(T v) {
    const auto* p = reinterpret_cast<const uint8_t*>(&v);
    b.insert(b.end(), p, p + sizeof(T));
    return *this;
  }
  Builder& str(const std::string& s) {
    put<uint64_t>(s.size());
    b.insert(b.end(), s.begin(), s.end());
    return *this;
  }
  Builder& header(uint32_t version, uint64_t tensors, uint64_t kvs) {
    return put<uint32_t>(0x46554747).put(version).put(tensors).put(kvs);
  }
  Builder& pad(size_t alignment = 32) {
    while (b.size() % alignment) b.push_back(0);
    return *this;
  }
};

// The message GgufFile gives for `bytes`, or "" when it reads them.
std::string refusal(const std::vector<uint8_t>& bytes) {
  test::TempDir dir;
  const std::string path = (dir.path / "f.gguf").string();
  write_bytes(path, bytes);
  try {
    GgufFile f(path);
    for (const auto& t : f.tensors()) f.dequantize(t);
  } catch (const RuntimeError& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST(GgufReader, ReadsEveryValueTypeAsGgufPy) {
  GgufFile f(test::fixture("gguf_blocks.gguf"));
  std::ifstream in(test::fixture("gguf_blocks_expected.json"));
  const nlohmann::json want = nlohmann::json::parse(in);
  EXPECT_EQ(f.version(), 3u);
  EXPECT_EQ(f.alignment(), 32u);
  ASSERT_EQ(f.metadata().size(), want["metadata"].size());
  const std::map<std::string, std::string> type_names{
      {"UINT8", "u8"},  {"INT8", "i8"},     {"UINT16", "u16"}, {"INT16", "i16"},     {"UINT32", "u32"},
      {"INT32", "i32"}, {"FLOAT32", "f32"}, {"BOOL", "bool"},  {"STRING", "string"}, {"UINT64", "u64"},
      {"INT64", "i64"}, {"FLOAT64", "f64"}, {"ARRAY", "array"}};
  for (const auto& [key, v] : f.metadata()) {
    SCOPED_TRACE(key);
    ASSERT_TRUE(want["metadata"].contains(key));
    const auto& w = want["metadata"][key];
    const auto& types = w["types"];
    EXPECT_EQ(gguf_value_type_name(v.type), type_names.at(types[0].get<std::string>()));
    if (v.is_array()) {
      EXPECT_EQ(gguf_value_type_name(v.elem), type_names.at(types[1].get<std::string>()));
    }
    nlohmann::json got;
    auto element = [&](size_t i) -> nlohmann::json {
      const GgufValueType t = v.is_array() ? v.elem : v.type;
      if (t == GgufValueType::string) return v.strings[i];
      if (t == GgufValueType::f32 || t == GgufValueType::f64) return v.floats[i];
      if (t == GgufValueType::boolean) return v.ints[i] != 0;
      return v.ints[i];
    };
    if (v.is_array()) {
      got = nlohmann::json::array();
      const size_t n = v.strings.size() + v.floats.size() + v.ints.size();
      for (size_t i = 0; i < n; ++i) got.push_back(element(i));
    } else {
      got = element(0);
    }
    EXPECT_EQ(got, w["value"]);
  }
  // Typed reads, and a type mismatch named.
  EXPECT_EQ(f.integer("test.u32"), 4000000000);
  EXPECT_EQ(f.integer("test.i64"), -(int64_t{1} << 62) - 1);
  EXPECT_EQ(f.number("test.f64"), 0.1);
  EXPECT_EQ(f.number("test.u8"), 200.0);
  EXPECT_EQ(f.boolean("test.bool"), true);
  EXPECT_EQ(f.string("general.architecture"), "llama");
  EXPECT_EQ(f.strings("test.strings")->at(2), "ünïcode");
  EXPECT_EQ(f.integers("test.ints")->at(1), -2);
  EXPECT_EQ(f.numbers("test.floats")->at(1), -1.25);
  EXPECT_FALSE(f.integer("test.absent").has_value());
  try {
    f.integer("test.string");
    ADD_FAILURE() << "a string read as an integer";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("test.string is string, expected an integer"), std::string::npos) << e.what();
  }
}

TEST(GgufReader, DequantizesEveryBlockTypeAsGgufPy) {
  GgufFile f(test::fixture("gguf_blocks.gguf"));
  SafetensorsFile want(test::fixture("gguf_blocks_expected.safetensors"));
  std::ifstream in(test::fixture("gguf_blocks_expected.json"));
  const nlohmann::json info = nlohmann::json::parse(in)["tensors"];
  ASSERT_EQ(f.tensors().size(), info.size());
  std::set<std::string> types;
  for (const auto& t : f.tensors()) {
    SCOPED_TRACE(t.name + " " + t.type_name());
    const auto& w = info[t.name];
    EXPECT_EQ(t.type_name(), w["type"].get<std::string>());
    EXPECT_EQ(t.shape, w["shape"].get<std::vector<int64_t>>());
    EXPECT_EQ(t.bytes, w["bytes"].get<int64_t>());
    const at::Tensor got = f.dequantize(t);
    const at::Tensor expected = want.tensor(t.name);
    ASSERT_EQ(got.sizes(), expected.sizes());
    EXPECT_TRUE(at::equal(got, expected)) << "max difference " << (got - expected).abs().max().item<float>();
    types.insert(t.type_name());
  }
  EXPECT_EQ(types.size(), 26u);  // every type ptrain reads
  // The header ends where the data begins, up to the alignment (what a tokenizer cache keys on).
  uint64_t first = UINT64_MAX;
  for (const auto& t : f.tensors()) first = std::min(first, t.offset);
  EXPECT_GT(f.header_bytes(), 0u);
  EXPECT_EQ((f.header_bytes() + f.alignment() - 1) / f.alignment() * f.alignment(), first);
}

TEST(GgufReader, ReadsWhatTheWriterWrites) {
  test::TempDir dir;
  const std::string path = (dir.path / "w.gguf").string();
  at::manual_seed(3);
  const at::Tensor a = at::randn({7, 64}), b = at::randn({3});
  GgufWriter w;
  w.add("general.architecture", std::string("llama"));
  w.add("test.floats", std::vector<float>{1.5f, -2.0f});
  w.add_tensor("a.f32", {7, 64}, GgmlType::f32, [&] { return a; });
  w.add_tensor("a.bf16", {7, 64}, GgmlType::bf16, [&] { return a; });
  w.add_tensor("a.q8_0", {7, 64}, GgmlType::q8_0, [&] { return a; });
  w.add_tensor("b.f16", {3}, GgmlType::f16, [&] { return b; });
  w.write(path);
  GgufFile f(path);
  EXPECT_EQ(f.string("general.architecture"), "llama");
  EXPECT_EQ(*f.numbers("test.floats"), (std::vector<double>{1.5, -2.0}));
  EXPECT_TRUE(at::equal(f.dequantize(*f.tensor("a.f32")), a));
  EXPECT_TRUE(at::equal(f.dequantize(*f.tensor("a.bf16")), a.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(at::equal(f.dequantize(*f.tensor("b.f16")), b.to(at::kHalf).to(at::kFloat)));
  // Q8_0: within half a step of each block's scale d = max|x| / 127, plus d's float16 rounding
  // (2^-11 relative) times the largest code, 127.
  const at::Tensor q = f.dequantize(*f.tensor("a.q8_0"));
  const at::Tensor step = std::get<0>(a.view({-1, 32}).abs().max(1, true)) / 127;
  EXPECT_TRUE(((q.view({-1, 32}) - a.view({-1, 32})).abs() <= step * (0.5 + 127.0 / 2048)).all().item<bool>());
}

TEST(GgufReader, EveryTruncationIsRefusedByName) {
  const std::vector<uint8_t> whole = read_bytes(test::fixture("gguf_blocks.gguf"));
  uint64_t end = 0;  // of the last tensor's data (the alignment padding after it is not needed)
  const GgufFile file(test::fixture("gguf_blocks.gguf"));
  for (const auto& t : file.tensors()) end = std::max(end, t.offset + static_cast<uint64_t>(t.bytes));
  // Every cut inside the header and metadata, then cuts through the tensor data.
  for (size_t n = 0; n < end; n += n < 1200 ? 1 : 97) {
    const std::string why = refusal(std::vector<uint8_t>(whole.begin(), whole.begin() + static_cast<ptrdiff_t>(n)));
    ASSERT_FALSE(why.empty()) << "a file cut at " << n << " of " << whole.size() << " bytes was read";
    ASSERT_NE(why.find("GGUF file"), std::string::npos) << why;
  }
  EXPECT_EQ(refusal(whole), "");
}

TEST(GgufReader, CorruptFieldsAreRefusedByName) {
  auto expect = [](const std::vector<uint8_t>& bytes, const std::string& says) {
    const std::string why = refusal(bytes);
    EXPECT_NE(why.find(says), std::string::npos) << "wanted \"" << says << "\", got \"" << why << "\"";
  };
  expect(Builder().put<uint32_t>(0x46554746).put<uint32_t>(3).b, "not a GGUF file");
  expect(Builder().header(1, 0, 0).b, "version 1");
  expect(Builder().header(0x03000000u, 0, 0).b, "big-endian");
  expect(Builder().header(3, 0, 1).str("k").put<uint32_t>(13).b, "unknown value type 13");
  expect(Builder().header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(9).put<uint64_t>(0).b, "array of arrays");
  expect(Builder().header(3, 0, 1).str("k").put<uint32_t>(7).put<uint8_t>(2).b, "bool value of 2");
  expect(
      Builder().header(3, 0, 2).str("k").put<uint32_t>(4).put<uint32_t>(1).str("k").put<uint32_t>(4).put<uint32_t>(2).b,
      "metadata key k appears twice");
  expect(Builder().header(3, 0, 1).str("general.alignment").put<uint32_t>(4).put<uint32_t>(48).b,
         "general.alignment must be a power of two");
  expect(Builder().header(3, 0, 1).str("general.alignment").put<uint32_t>(10).put<uint64_t>(32).b,
         "general.alignment must be a power of two as a u32, not u64");
  expect(Builder().header(3, 0, 1).str("k").put<uint32_t>(9).put<uint32_t>(8).put<uint64_t>(uint64_t{1} << 60).b,
         "reading an array's length");
  expect(Builder().header(3, uint64_t{1} << 40, 0).b, "reading the tensor count");
  auto tensor = [](uint32_t dims, std::vector<uint64_t> ne, uint32_t type, uint64_t offset) {
    Builder t;
    t.header(3, 1, 0).str("t").put(dims);
    for (uint64_t d : ne) t.put(d);
    t.put(type).put(offset).pad();
    return t;
  };
  expect(tensor(5, {1, 1, 1, 1, 1}, 0, 0).b, "tensor t has 5 dimensions");
  expect(tensor(2, {0, 4}, 0, 0).b, "tensor t has dimension 0");
  expect(tensor(1, {48}, 12, 0).b, "rows of 48 elements are not whole Q4_K blocks of 256");
  expect(tensor(1, {32}, 0, 4).b, "offset 4 is not a multiple of the alignment 32");
  expect(tensor(1, {32}, 0, 0).b, "lies past the end of the file");
  Builder q8_1 = tensor(1, {32}, 9, 0);  // Q8_1: ggml's dot-product intermediate, which gguf-py does not read
  q8_1.b.resize(q8_1.b.size() + 36);
  expect(q8_1.b, "tensor t is Q8_1, which ptrain does not read");
  Builder twice;
  twice.header(3, 2, 0);
  for (int i = 0; i < 2; ++i) twice.str("t").put<uint32_t>(1).put<uint64_t>(8).put<uint32_t>(0).put<uint64_t>(0);
  expect(twice.pad().b, "tensor t appears twice");
}

// A split model as llama.cpp's gguf-split writes it (split.no / split.count in every part,
// split.tensors.count in the first, the parts named PREFIX-0000K-of-0000N.gguf): read from its
// first part as llama.cpp's model loader reads it — every part's tensors, found by those names —,
// and each way the parts can disagree refused naming the part (sweep.gguf_import reads parts
// gguf-py's writer splits, with model.gguf_reader = "llama.cpp").
TEST(GgufReader, ASplitModelIsReadFromItsFirstPartAsLlamaCppReadsIt) {
  namespace fs = std::filesystem;
  at::manual_seed(5);
  const std::vector<at::Tensor> values{at::randn({4, 32}), at::randn({3}), at::randn({2, 32}), at::randn({5})};
  const std::vector<std::string> names{"a", "b", "c", "d"};
  // What a test changes: each part's split.no, the count of tensors the first declares, a tensor
  // the last part holds again.
  struct Parts {
    std::vector<uint32_t> no{0, 1, 2};
    int32_t tensors = 4;
    bool repeat = false;
  };
  // Writes the parts into `dir` as m-0000K-of-00003.gguf; returns the first's path.
  auto write = [&](const fs::path& dir, const Parts& parts) {
    const std::vector<std::vector<int>> held{{0, 1}, {2}, parts.repeat ? std::vector<int>{3, 0} : std::vector<int>{3}};
    for (int p = 0; p < 3; ++p) {
      GgufWriter w;
      if (p == 0) w.add("general.architecture", std::string("llama"));
      w.add("split.no", parts.no[p]);
      w.add("split.count", uint32_t(3));
      if (p == 0) w.add("split.tensors.count", parts.tensors);
      for (int i : held[p])
        w.add_tensor(names[i], values[i].sizes().vec(), GgmlType::f32, [&, i] { return values[i]; });
      char name[32];
      std::snprintf(name, sizeof name, "m-%05d-of-00003.gguf", p + 1);
      w.write((dir / name).string());
    }
    return (dir / "m-00001-of-00003.gguf").string();
  };
  // The message reading `first` and its parts gives, or "" when it reads them.
  auto refusal = [](const std::string& first) -> std::string {
    try {
      GgufFile f(first);
      f.add_split_parts();
    } catch (const RuntimeError& e) {
      return e.what();
    }
    return "";
  };
  {
    test::TempDir dir;
    const std::string first = write(dir.path, {});
    GgufFile f(first);
    EXPECT_EQ(f.split_no(), 0);
    EXPECT_EQ(f.split_count(), 3);
    EXPECT_EQ(f.tensors().size(), 2u);  // this file's, until the parts are added
    f.add_split_parts();
    ASSERT_EQ(f.tensors().size(), 4u);
    for (size_t i = 0; i < names.size(); ++i)
      EXPECT_TRUE(at::equal(f.dequantize(*f.tensor(names[i])), values[i])) << names[i];
    const std::vector<std::string> paths{first, (dir.path / "m-00002-of-00003.gguf").string(),
                                         (dir.path / "m-00003-of-00003.gguf").string()};
    EXPECT_EQ(f.part_paths(), paths);
    // A directory holding just the parts names its first.
    EXPECT_EQ(gguf_file_at(dir.path.string(), "config.json", "model.hf_path"), first);
    // Another part opened first is refused naming the first.
    EXPECT_NE(refusal(paths[1]).find("part 2 of 3 of a split model; name its first part, " + first), std::string::npos)
        << refusal(paths[1]);
    fs::remove(paths[2]);
    EXPECT_NE(refusal(first).find("part 3 of 3 of this split model, " + paths[2] + ", is missing"), std::string::npos)
        << refusal(first);
  }
  auto expect = [&](const Parts& parts, const std::string& says, const std::string& rename = "") {
    test::TempDir dir;
    std::string first = write(dir.path, parts);
    if (!rename.empty()) fs::rename(first, dir.path / rename), first = (dir.path / rename).string();
    const std::string why = refusal(first);
    EXPECT_NE(why.find(says), std::string::npos) << "wanted \"" << says << "\", got \"" << why << "\"";
  };
  expect({}, "the first of 3 parts of a split model, not named PREFIX-00001-of-00003.gguf", "m.gguf");
  expect({.no = {0, 1, 1}}, "split.no is 1, not 2: it is not part 3 of");
  expect({.tensors = 5}, "split.tensors.count is 5 but its 3 parts hold 4 tensors");
  expect({.repeat = true}, "m-00003-of-00003.gguf: tensor a is also in ");
  expect({.no = {0, 70000, 2}}, "split.no = 70000 is outside [0, 65535]");
}
