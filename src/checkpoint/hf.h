// Hugging Face Llama directories: config.json -> LlamaShape, and the tensors of
// model.safetensors or of the shards listed in model.safetensors.index.json.
#pragma once
#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"
#include "model/shape.h"

namespace ptrain {

// Reads DIR/config.json (LlamaForCausalLM). Throws RuntimeError naming the missing field.
LlamaShape read_hf_config(const std::string& dir);

// Writes DIR/config.json for `shape` (fp32 weights, LlamaForCausalLM).
void write_hf_config(const std::string& dir, const LlamaShape& shape);

class HfCheckpoint {
 public:
  // Opens model.safetensors, or every shard named by model.safetensors.index.json.
  explicit HfCheckpoint(const std::string& dir);
  // The stored tensor (any dtype, read-only view over the mapping).
  at::Tensor tensor(const std::string& name) const;
  // tensor() as a function, for FsdpModel::load (valid while this checkpoint is).
  std::function<at::Tensor(const std::string&)> by_name() const {
    return [this](const std::string& name) { return tensor(name); };
  }

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<SafetensorsFile>> files_;  // by file name
  std::map<std::string, std::shared_ptr<SafetensorsFile>> where_;  // tensor -> file
};

}  // namespace ptrain
