// Reading a GGUF file (versions 2 and 3, little-endian; checkpoint/gguf.h writes them): the header,
// every metadata key with its typed value, the tensor descriptors, and each tensor's data
// dequantized to float32 (quant/ggml_quants.h). The file is memory-mapped and parsed with every
// length and offset checked against its size: a truncated or corrupt file is refused naming the
// file, the byte offset and what was being read, never read past.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "quant/ggml_quants.h"

namespace ptrain {

class MappedFile;

// GGUF's metadata value types, as the file stores them.
enum class GgufValueType : uint32_t {
  u8 = 0,
  i8 = 1,
  u16 = 2,
  i16 = 3,
  u32 = 4,
  i32 = 5,
  f32 = 6,
  boolean = 7,
  string = 8,
  array = 9,
  u64 = 10,
  i64 = 11,
  f64 = 12,
};
const char* gguf_value_type_name(GgufValueType t);

// One metadata value: a scalar is an array of one element that is not an array. Integers and
// booleans are held as int64 (a u64 above INT64_MAX is refused on reading), floats as double.
struct GgufMeta {
  GgufValueType type = GgufValueType::u8;  // array: `elem` is the elements' type
  GgufValueType elem = GgufValueType::u8;
  std::vector<int64_t> ints;
  std::vector<double> floats;
  std::vector<std::string> strings;
  bool is_array() const { return type == GgufValueType::array; }
  std::string type_name() const;  // "u32", "array of string"
};

struct GgufTensorInfo {
  std::string name;
  std::vector<int64_t> shape;  // PyTorch's order: the file's dimensions reversed (ne[0] last)
  uint32_t type = 0;           // the ggml type id, as stored (ggml_type_info may not know it)
  int64_t numel = 0;
  uint64_t offset = 0;  // from the start of the file
  int64_t bytes = 0;
  uint32_t part = 0;              // the file of a split model that holds it (0: the one opened)
  std::string type_name() const;  // ggml's name ("Q4_K"), or "type N"
};

class GgufFile {
 public:
  explicit GgufFile(const std::string& path);  // throws RuntimeError naming the file and the problem
  ~GgufFile();
  GgufFile(const GgufFile&) = delete;
  GgufFile& operator=(const GgufFile&) = delete;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  // Bytes of the header, metadata and tensor descriptors: everything but the tensor data.
  uint64_t header_bytes() const { return header_bytes_; }

  // Metadata, in file order.
  const std::vector<std::pair<std::string, GgufMeta>>& metadata() const { return kv_; }
  const GgufMeta* find(const std::string& key) const;
  // Typed reads of a key: nullopt / nullptr when absent; RuntimeError naming the key when its
  // value has another type (integer: any integer type; number: any integer or float type).
  std::optional<int64_t> integer(const std::string& key) const;
  std::optional<double> number(const std::string& key) const;
  std::optional<bool> boolean(const std::string& key) const;
  std::optional<std::string> string(const std::string& key) const;
  const std::vector<std::string>* strings(const std::string& key) const;  // array of string
  const std::vector<int64_t>* integers(const std::string& key) const;     // array of integers
  const std::vector<double>* numbers(const std::string& key) const;       // array of floats

  // A split model (llama.cpp's gguf-split: `split.count` files PREFIX-0000K-of-0000N.gguf, the
  // metadata in the first, `split.no` numbering them from 0): this file's number and the count,
  // (0, 1) for a whole file. add_split_parts() opens the other parts, found by llama.cpp's names,
  // and adds their tensors as llama.cpp loads them (this must be the first; each part's split.no its
  // own; no tensor twice; split.tensors.count in all) — RuntimeError naming the part otherwise.
  int64_t split_no() const;
  int64_t split_count() const;
  void add_split_parts();
  const std::vector<std::string>& part_paths() const { return part_paths_; }  // this file's, then the others

  const std::vector<GgufTensorInfo>& tensors() const { return tensors_; }
  const GgufTensorInfo* tensor(const std::string& name) const;
  // The tensor as float32 in its PyTorch shape; RuntimeError naming the tensor and its type when
  // ptrain does not read that type (quant/ggml_quants.h lists those it does).
  at::Tensor dequantize(const GgufTensorInfo& t) const;
  const uint8_t* data(const GgufTensorInfo& t) const;

 private:
  std::string path_;
  std::unique_ptr<MappedFile> file_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t header_bytes_ = 0;
  std::vector<std::pair<std::string, GgufMeta>> kv_;
  std::map<std::string, size_t> kv_index_;
  std::vector<GgufTensorInfo> tensors_;
  std::map<std::string, size_t> tensor_index_;
  std::vector<std::unique_ptr<GgufFile>> parts_;  // a split model's other files
  std::vector<std::string> part_paths_;
};

// The GGUF file `path` names: `path` itself when it is a file ending in ".gguf" or starting with
// GGUF's magic; the one *.gguf file of a directory without `absent` (config.json for a model,
// tokenizer.json for a tokenizer); "" otherwise. Several GGUF files in such a directory are
// refused (UnsupportedInput) listing them: which one is the user's choice, made by setting `key`.
std::string gguf_file_at(const std::string& path, const std::string& absent, const std::string& key);

}  // namespace ptrain
