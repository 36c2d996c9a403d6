// GGUF version 3, the file format of llama.cpp (and Ollama, LM Studio): a header, typed metadata
// key/values, tensor descriptors, then the tensors' data, each aligned to `general.alignment`
// (32 bytes). GgufWriter collects metadata and tensors, then streams the file in one pass to
// PATH.tmp.<pid> and renames it over PATH: a failure leaves no partial file.
//
// Tensor types written: F32, F16, BF16 (rounded to nearest even, as torch and gguf-py round) and
// Q8_0 (ggml's block of 32: a float16 scale d = max|x| / 127 and 32 int8 codes round(x / d),
// rounded half away from zero — what gguf-py's quantizer and llama.cpp's own produce, bit for bit).
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "quant/ggml_quants.h"

namespace ptrain {

// Q8_0 blocks of a float32 tensor whose element count is a multiple of 32 (rows of 32-multiples):
// 34 bytes per 32 elements.
std::vector<uint8_t> quantize_q8_0(const at::Tensor& x);

// A metadata value: the GGUF value types ptrain writes.
using GgufValue = std::variant<uint32_t, int32_t, float, bool, std::string, std::vector<std::string>,
                               std::vector<int32_t>, std::vector<float>>;

class GgufWriter {
 public:
  void add(const std::string& key, GgufValue value);
  // A tensor of `shape` as PyTorch orders it ([rows, cols]; the file stores dimensions fastest
  // first, [cols, rows]) in `type`; `values` gives its float32 contents when the file is written
  // (so only one tensor's conversion is alive at a time).
  void add_tensor(const std::string& name, std::vector<int64_t> shape, GgmlType type,
                  std::function<at::Tensor()> values);
  // Streams the file; returns its size in bytes. `progress(i, n)` after each tensor.
  uint64_t write(const std::string& path, const std::function<void(size_t, size_t)>& progress = nullptr) const;

  size_t tensor_count() const { return tensors_.size(); }
  int64_t tensor_bytes() const;  // the data section's payload (without alignment padding)

 private:
  struct Tensor {
    std::string name;
    std::vector<int64_t> shape;
    GgmlType type;
    std::function<at::Tensor()> values;
  };
  std::vector<std::pair<std::string, GgufValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace ptrain
