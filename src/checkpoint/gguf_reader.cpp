#include "checkpoint/gguf_reader.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

namespace {

constexpr uint32_t kGgufMagic = 0x46554747;  // "GGUF", little-endian
constexpr uint32_t kMaxDims = 4;             // GGML_MAX_DIMS

// A bounds-checked cursor over the mapped file.
class Cursor {
 public:
  Cursor(const std::string& path, const uint8_t* data, uint64_t size) : path_(path), data_(data), size_(size) {}

  template <typename T>
  T get(const char* what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, data_ + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string str(const char* what) {
    const auto n = get<uint64_t>(what);
    need(n, what);
    std::string s(reinterpret_cast<const char*>(data_ + pos_), n);
    pos_ += n;
    return s;
  }
  // An element count read from the file, checked against the bytes left at `min_bytes` each.
  uint64_t count(const char* what, uint64_t min_bytes) {
    const auto n = get<uint64_t>(what);
    if (min_bytes > 0 && n > (size_ - pos_) / min_bytes)
      fail(std::string(what) + " of " + std::to_string(n) + " entries");
    return n;
  }
  uint64_t pos() const { return pos_; }
  [[noreturn]] void fail(const std::string& what) const {
    throw RuntimeError("GGUF file " + path_ + ": truncated or corrupt at byte " + std::to_string(pos_) + " (reading " +
                       what + ", file of " + std::to_string(size_) + " bytes)");
  }

 private:
  void need(uint64_t n, const char* what) const {
    if (n > size_ - pos_) fail(what);
  }
  const std::string& path_;
  const uint8_t* data_;
  uint64_t size_;
  uint64_t pos_ = 0;
};

bool is_integer(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::u16:
    case GgufValueType::i16:
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::u64:
    case GgufValueType::i64:
      return true;
    default:
      return false;
  }
}

bool is_float(GgufValueType t) { return t == GgufValueType::f32 || t == GgufValueType::f64; }

// Appends one element of type t to v.
void read_element(Cursor& c, GgufValueType t, GgufMeta& v, const std::string& key) {
  switch (t) {
    case GgufValueType::u8:
      v.ints.push_back(c.get<uint8_t>("a u8 value"));
      return;
    case GgufValueType::i8:
      v.ints.push_back(c.get<int8_t>("an i8 value"));
      return;
    case GgufValueType::u16:
      v.ints.push_back(c.get<uint16_t>("a u16 value"));
      return;
    case GgufValueType::i16:
      v.ints.push_back(c.get<int16_t>("an i16 value"));
      return;
    case GgufValueType::u32:
      v.ints.push_back(c.get<uint32_t>("a u32 value"));
      return;
    case GgufValueType::i32:
      v.ints.push_back(c.get<int32_t>("an i32 value"));
      return;
    case GgufValueType::i64:
      v.ints.push_back(c.get<int64_t>("an i64 value"));
      return;
    case GgufValueType::u64: {
      const auto u = c.get<uint64_t>("a u64 value");
      if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
        throw RuntimeError("GGUF metadata " + key + ": u64 value " + std::to_string(u) + " is out of range");
      v.ints.push_back(static_cast<int64_t>(u));
      return;
    }
    case GgufValueType::boolean: {
      const auto b = c.get<uint8_t>("a bool value");
      if (b > 1) c.fail("a bool value of " + std::to_string(b) + " for " + key);
      v.ints.push_back(b);
      return;
    }
    case GgufValueType::f32:
      v.floats.push_back(c.get<float>("an f32 value"));
      return;
    case GgufValueType::f64:
      v.floats.push_back(c.get<double>("an f64 value"));
      return;
    case GgufValueType::string:
      v.strings.push_back(c.str("a string value"));
      return;
    case GgufValueType::array:
      break;
  }
  c.fail("the value of " + key + ": value type " + std::to_string(static_cast<uint32_t>(t)));
}

uint64_t element_min_bytes(GgufValueType t) {
  switch (t) {
    case GgufValueType::u8:
    case GgufValueType::i8:
    case GgufValueType::boolean:
      return 1;
    case GgufValueType::u16:
    case GgufValueType::i16:
      return 2;
    case GgufValueType::u32:
    case GgufValueType::i32:
    case GgufValueType::f32:
      return 4;
    default:
      return 8;  // 64-bit values, and a string's length
  }
}

bool known_type(uint32_t t) { return t <= static_cast<uint32_t>(GgufValueType::f64); }

}  // namespace

const char* gguf_value_type_name(GgufValueType t) {
  static const char* const kNames[] = {"u8",   "i8",     "u16",   "i16", "u32", "i32", "f32",
                                       "bool", "string", "array", "u64", "i64", "f64"};
  const auto i = static_cast<uint32_t>(t);
  return i < sizeof(kNames) / sizeof(kNames[0]) ? kNames[i] : "?";
}

std::string GgufMeta::type_name() const {
  return is_array() ? std::string("array of ") + gguf_value_type_name(elem) : gguf_value_type_name(type);
}

std::string GgufTensorInfo::type_name() const { return ggml_any_type_name(type); }

GgufFile::GgufFile(const std::string& path)
    : path_(path), file_(std::make_unique<MappedFile>(path)), part_paths_{path} {
  Cursor c(path_, file_->data(), file_->size());
  if (file_->size() < 8 || c.get<uint32_t>("the magic") != kGgufMagic)
    throw RuntimeError("GGUF file " + path_ + ": not a GGUF file (it does not start with \"GGUF\")");
  version_ = c.get<uint32_t>("the version");
  if (version_ == 0x02000000u || version_ == 0x03000000u)
    throw RuntimeError("GGUF file " + path_ +
                       ": a big-endian GGUF; ptrain reads little-endian files (llama.cpp's default)");
  if (version_ != 2 && version_ != 3)
    throw RuntimeError("GGUF file " + path_ + ": version " + std::to_string(version_) +
                       "; ptrain reads versions 2 and 3 (re-convert it with a current llama.cpp)");
  const uint64_t n_tensors = c.count("the tensor count", 8 + 4 + 8 + 4 + 8);  // name, dims, one dim, type, offset
  const uint64_t n_kv = c.count("the metadata count", 8 + 4 + 1);
  for (uint64_t i = 0; i < n_kv; ++i) {
    std::string key = c.str("a metadata key");
    const auto type = c.get<uint32_t>("a metadata value type");
    if (!known_type(type)) c.fail("the value of " + key + ": unknown value type " + std::to_string(type));
    GgufMeta v;
    v.type = v.elem = static_cast<GgufValueType>(type);
    if (v.is_array()) {
      const auto elem = c.get<uint32_t>("an array's element type");
      if (!known_type(elem) || elem == static_cast<uint32_t>(GgufValueType::array))
        throw RuntimeError("GGUF file " + path_ + ": metadata " + key + " is an array of " +
                           (known_type(elem) ? "arrays" : "unknown type " + std::to_string(elem)) +
                           ", which ptrain does not read");
      v.elem = static_cast<GgufValueType>(elem);
      const uint64_t n = c.count("an array's length", element_min_bytes(v.elem));
      for (uint64_t j = 0; j < n; ++j) read_element(c, v.elem, v, key);
    } else {
      read_element(c, v.type, v, key);
    }
    if (kv_index_.count(key)) throw RuntimeError("GGUF file " + path_ + ": metadata key " + key + " appears twice");
    kv_index_[key] = kv_.size();
    kv_.emplace_back(std::move(key), std::move(v));
  }
  if (const GgufMeta* a = find("general.alignment")) {
    if (a->is_array() || a->type != GgufValueType::u32 || a->ints[0] <= 0 || (a->ints[0] & (a->ints[0] - 1)) != 0)
      throw RuntimeError("GGUF file " + path_ + ": general.alignment must be a power of two as a u32, not " +
                         a->type_name() + (a->ints.empty() ? "" : " " + std::to_string(a->ints[0])));
    alignment_ = static_cast<uint64_t>(a->ints[0]);
  }
  for (uint64_t i = 0; i < n_tensors; ++i) {
    GgufTensorInfo t;
    t.name = c.str("a tensor name");
    const auto dims = c.get<uint32_t>("a tensor's dimension count");
    if (dims == 0 || dims > kMaxDims)
      throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + " has " + std::to_string(dims) +
                         " dimensions (ggml has 1 to 4)");
    std::vector<int64_t> ne;
    t.numel = 1;
    for (uint32_t d = 0; d < dims; ++d) {
      const auto n = c.get<uint64_t>("a tensor dimension");
      if (n == 0 || n > (uint64_t{1} << 40) || static_cast<uint64_t>(t.numel) > (uint64_t{1} << 50) / n)
        throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + " has dimension " + std::to_string(n));
      ne.push_back(static_cast<int64_t>(n));
      t.numel *= static_cast<int64_t>(n);
    }
    t.shape.assign(ne.rbegin(), ne.rend());
    t.type = c.get<uint32_t>("a tensor type");
    const uint64_t relative = c.get<uint64_t>("a tensor offset");
    if (const GgmlTypeInfo* info = ggml_type_info(t.type)) {
      if (ne[0] % info->block != 0)
        throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + "'s rows of " + std::to_string(ne[0]) +
                           " elements are not whole " + info->name + " blocks of " + std::to_string(info->block));
      t.bytes = t.numel / info->block * info->block_bytes;
    }
    if (relative % alignment_ != 0)
      throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + "'s offset " + std::to_string(relative) +
                         " is not a multiple of the alignment " + std::to_string(alignment_));
    t.offset = relative;  // made absolute below
    if (tensor_index_.count(t.name)) throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + " appears twice");
    tensor_index_[t.name] = tensors_.size();
    tensors_.push_back(std::move(t));
  }
  const uint64_t data_start = (c.pos() + alignment_ - 1) / alignment_ * alignment_;
  header_bytes_ = c.pos();
  for (auto& t : tensors_) {
    t.offset += data_start;
    if (t.offset > file_->size() || static_cast<uint64_t>(t.bytes) > file_->size() - t.offset)
      throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + "'s data (" + std::to_string(t.bytes) +
                         " bytes at " + std::to_string(t.offset) + ") lies past the end of the file (" +
                         std::to_string(file_->size()) + " bytes): the file is truncated");
  }
}

GgufFile::~GgufFile() = default;

const GgufMeta* GgufFile::find(const std::string& key) const {
  const auto it = kv_index_.find(key);
  return it == kv_index_.end() ? nullptr : &kv_[it->second].second;
}

namespace {
[[noreturn]] void wrong_type(const std::string& path, const std::string& key, const GgufMeta& v, const char* want) {
  throw RuntimeError("GGUF file " + path + ": metadata " + key + " is " + v.type_name() + ", expected " + want);
}
}  // namespace

std::optional<int64_t> GgufFile::integer(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_array() || !is_integer(v->type)) wrong_type(path_, key, *v, "an integer");
  return v->ints[0];
}

std::optional<double> GgufFile::number(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return std::nullopt;
  if (!v->is_array() && is_float(v->type)) return v->floats[0];
  if (!v->is_array() && is_integer(v->type)) return static_cast<double>(v->ints[0]);
  wrong_type(path_, key, *v, "a number");
}

std::optional<bool> GgufFile::boolean(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_array() || v->type != GgufValueType::boolean) wrong_type(path_, key, *v, "a bool");
  return v->ints[0] != 0;
}

std::optional<std::string> GgufFile::string(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return std::nullopt;
  if (v->is_array() || v->type != GgufValueType::string) wrong_type(path_, key, *v, "a string");
  return v->strings[0];
}

const std::vector<std::string>* GgufFile::strings(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array() || v->elem != GgufValueType::string) wrong_type(path_, key, *v, "an array of string");
  return &v->strings;
}

const std::vector<int64_t>* GgufFile::integers(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array() || !is_integer(v->elem)) wrong_type(path_, key, *v, "an array of integers");
  return &v->ints;
}

const std::vector<double>* GgufFile::numbers(const std::string& key) const {
  const GgufMeta* v = find(key);
  if (!v) return nullptr;
  if (!v->is_array() || !is_float(v->elem)) wrong_type(path_, key, *v, "an array of floats");
  return &v->floats;
}

const GgufTensorInfo* GgufFile::tensor(const std::string& name) const {
  const auto it = tensor_index_.find(name);
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const uint8_t* GgufFile::data(const GgufTensorInfo& t) const {
  return (t.part == 0 ? *file_ : *parts_.at(t.part - 1)->file_).data() + t.offset;
}

namespace {

// A split key as llama.cpp reads it (a u16 there; any integer type here), `fallback` when absent.
int64_t split_key(const GgufFile& f, const std::string& key, int64_t fallback) {
  const auto v = f.integer(key);
  if (!v) return fallback;
  if (*v < 0 || *v > 65535)
    throw RuntimeError("GGUF file " + f.path() + ": " + key + " = " + std::to_string(*v) +
                       " is outside [0, 65535] (llama.cpp reads it as a u16)");
  return *v;
}

// llama.cpp's name of a split model's part `no` (from 0) of `count`: PREFIX-0000K-of-0000N.gguf.
std::string split_postfix(int64_t no, int64_t count) {
  char postfix[32];
  std::snprintf(postfix, sizeof postfix, "-%05d-of-%05d.gguf", static_cast<int>(no + 1), static_cast<int>(count));
  return postfix;
}

}  // namespace

int64_t GgufFile::split_no() const { return split_key(*this, "split.no", 0); }
int64_t GgufFile::split_count() const { return std::max<int64_t>(split_key(*this, "split.count", 1), 1); }

void GgufFile::add_split_parts() {
  const int64_t count = split_count();
  if (count <= 1 || !parts_.empty()) return;
  if (const int64_t no = split_no(); no != 0) {
    const std::string own = split_postfix(no, count);
    const std::string first = path_.ends_with(own)
                                  ? path_.substr(0, path_.size() - own.size()) + split_postfix(0, count)
                                  : "PREFIX" + split_postfix(0, count);
    throw RuntimeError("GGUF file " + path_ + ": part " + std::to_string(no + 1) + " of " + std::to_string(count) +
                       " of a split model; name its first part, " + first + ", from which llama.cpp finds the others");
  }
  const std::string first = split_postfix(0, count);
  if (path_.size() <= first.size() || !path_.ends_with(first))
    throw RuntimeError("GGUF file " + path_ + ": the first of " + std::to_string(count) +
                       " parts of a split model, not named PREFIX" + first +
                       " as llama.cpp names the parts and finds them by (rename the parts so)");
  const std::string prefix = path_.substr(0, path_.size() - first.size());
  for (int64_t no = 1; no < count; ++no) {
    const std::string name = prefix + split_postfix(no, count);
    if (!std::filesystem::is_regular_file(name))
      throw RuntimeError("GGUF file " + path_ + ": part " + std::to_string(no + 1) + " of " + std::to_string(count) +
                         " of this split model, " + name + ", is missing");
    auto part = std::make_unique<GgufFile>(name);
    if (!part->find("split.no") || part->split_no() != no)
      throw RuntimeError("GGUF file " + name + ": split.no is " +
                         (part->find("split.no") ? std::to_string(part->split_no()) : std::string("missing")) +
                         ", not " + std::to_string(no) + ": it is not part " + std::to_string(no + 1) + " of " + path_ +
                         "'s model");
    for (GgufTensorInfo t : part->tensors()) {
      if (tensor_index_.count(t.name))
        throw RuntimeError("GGUF file " + name + ": tensor " + t.name + " is also in " +
                           part_paths_[tensors_[tensor_index_[t.name]].part]);
      t.part = static_cast<uint32_t>(parts_.size() + 1);
      tensor_index_[t.name] = tensors_.size();
      tensors_.push_back(std::move(t));
    }
    part_paths_.push_back(name);
    parts_.push_back(std::move(part));
  }
  const auto expected = integer("split.tensors.count");
  if (!expected || *expected != static_cast<int64_t>(tensors_.size()))
    throw RuntimeError("GGUF file " + path_ + ": split.tensors.count is " +
                       (expected ? std::to_string(*expected) : std::string("missing")) + " but its " +
                       std::to_string(count) + " parts hold " + std::to_string(tensors_.size()) + " tensors");
}

at::Tensor GgufFile::dequantize(const GgufTensorInfo& t) const {
  const GgmlTypeInfo* info = ggml_type_info(t.type);
  if (!info)
    throw RuntimeError("GGUF file " + path_ + ": tensor " + t.name + " is " + t.type_name() +
                       ", which ptrain does not read (" + kGgmlTypesRead + ")");
  at::Tensor out = at::empty(t.shape, at::kFloat);
  const uint8_t* src = data(t);
  float* dst = out.data_ptr<float>();
  const int64_t blocks = t.numel / info->block;
  at::parallel_for(0, blocks, 4096, [&](int64_t b0, int64_t b1) {
    ggml_dequantize(info->type, src + b0 * info->block_bytes, (b1 - b0) * info->block, dst + b0 * info->block);
  });
  return out;
}

std::string gguf_file_at(const std::string& path, const std::string& absent, const std::string& key) {
  namespace fs = std::filesystem;
  const fs::path p(path);
  if (fs::is_regular_file(p)) {
    if (p.extension() == ".gguf") return path;
    std::ifstream in(p, std::ios::binary);
    char magic[4] = {};
    return in.read(magic, 4) && std::memcmp(magic, "GGUF", 4) == 0 ? path : "";
  }
  if (!fs::is_directory(p) || fs::exists(p / absent)) return "";
  std::vector<std::string> found;
  for (const auto& e : fs::directory_iterator(p))
    if (e.is_regular_file() && e.path().extension() == ".gguf") found.push_back(e.path().string());
  std::sort(found.begin(), found.end());
  // The parts of one split model, named as llama.cpp names them: the first, which names the rest.
  if (found.size() > 1 && found.front().ends_with(split_postfix(0, static_cast<int64_t>(found.size())))) {
    const std::string prefix = found.front().substr(0, found.front().size() - split_postfix(0, 1).size());
    bool parts = true;
    for (size_t i = 0; i < found.size(); ++i)
      parts = parts && found[i] == prefix + split_postfix(static_cast<int64_t>(i), static_cast<int64_t>(found.size()));
    if (parts) return found.front();
  }
  if (found.size() > 1) {
    std::string names;
    for (const auto& n : found) names += "\n  " + n;
    throw UnsupportedInput(path + " holds " + std::to_string(found.size()) + " GGUF files and no " + absent + ": set " +
                           key + " to the one to use:" + names);
  }
  return found.empty() ? "" : found.front();
}

}  // namespace ptrain
