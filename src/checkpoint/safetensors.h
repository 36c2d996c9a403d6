// safetensors reader (memory-mapped, every offset checked) and writer.
// Format: u64 little-endian header length N, N bytes of JSON
//   {"name": {"dtype": "F32", "shape": [..], "data_offsets": [begin, end]}, "__metadata__": {..}}
// then the data buffer; offsets are relative to the buffer, which must be covered exactly
// (no overlaps, no holes).
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "common/fs_util.h"

namespace ptrain {

struct SafetensorsEntry {
  std::string name;
  std::string dtype;  // "F32", "BF16", "F16", ...
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // offsets into the data buffer
  uint64_t end = 0;
};

// A file of named tensors a model directory holds: model.safetensors (SafetensorsFile) or
// pytorch_model.bin (TorchBinFile, checkpoint/torch_bin.h), and their shards.
class WeightFile {
 public:
  virtual ~WeightFile() = default;
  virtual const std::string& path() const = 0;
  virtual const std::vector<SafetensorsEntry>& entries() const = 0;  // dtypes as safetensors names them
  virtual bool contains(const std::string& name) const = 0;
  virtual const SafetensorsEntry& entry(const std::string& name) const = 0;
  // A CPU tensor of the stored values. Read-only: copy it (`.to(...)`, `.clone()`) before writing.
  virtual at::Tensor tensor(const std::string& name) const = 0;
};

// safetensors' name of a dtype ("BF16"), or nullptr for one it has no name for.
const char* safetensors_dtype_name(at::ScalarType t);

class SafetensorsFile : public WeightFile {
 public:
  // Maps and validates the file. Throws RuntimeError naming the file and the problem.
  explicit SafetensorsFile(const std::string& path);

  const std::string& path() const override { return path_; }
  const std::vector<SafetensorsEntry>& entries() const override { return entries_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  bool contains(const std::string& name) const override { return index_.count(name) > 0; }
  const SafetensorsEntry& entry(const std::string& name) const override;

  // A CPU tensor over the mapped bytes (no copy when aligned); it keeps the mapping alive.
  at::Tensor tensor(const std::string& name) const override;

 private:
  struct Mapping;
  std::string path_;
  std::shared_ptr<Mapping> map_;
  void map_file();                       // maps path_ (read-only) into map_
  const unsigned char* data_ = nullptr;  // start of the data buffer
  std::vector<SafetensorsEntry> entries_;
  std::map<std::string, size_t> index_;
  std::map<std::string, std::string> metadata_;
};

// Writes tensors (in the given order) atomically: temp file, fsync, rename. Returns the file's
// size and CRC-32, computed as it was written.
FileSum write_safetensors(const std::string& path, const std::vector<std::pair<std::string, at::Tensor>>& tensors,
                          const std::map<std::string, std::string>& metadata = {});

}  // namespace ptrain
