// LoRA adapters in PEFT's format: <dir>/adapter_config.json (peft_type LORA, r, lora_alpha,
// lora_dropout, target_modules, ...) and <dir>/adapter_model.safetensors with keys
// "base_model.model.<ptrain slot name>", e.g.
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" [r, in] and ...lora_B.weight
// [out, r] — what `PeftModel.from_pretrained` loads and `save_pretrained` writes.
//
// adapter_config.json is read as PEFT 0.21 writes it, every key accounted for: r, lora_alpha,
// lora_dropout, use_rslora (scale alpha/sqrt(r)) and target_modules (a list of module names, a
// regex PEFT matches against full module names, or "all-linear") are implemented; nulls and the
// keys that only describe the file or the adapter's initialisation are accepted; keys that change
// the network — rank_pattern / alpha_pattern, layers_to_transform / layers_pattern,
// modules_to_save, bias other than "none", DoRA, LoRA biases, layer replication, ... — are
// refused by name unless they hold their neutral value; a key PEFT did not have is refused too.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ptrain {

struct LlamaShape;

struct PeftAdapter {
  int64_t rank = 0;
  double alpha = 0.0;
  double dropout = 0.0;
  bool rslora = false;                        // use_rslora: scale alpha / sqrt(rank) instead of alpha / rank
  std::vector<std::string> targets;           // ptrain's names: q, k, v, o, gate, up, down, output
  std::map<std::string, at::Tensor> tensors;  // by ptrain slot name ("model.layers.0....lora_A.weight")
  std::string base_model;                     // base_model_name_or_path ("" when null)
};

// adapter_config.json alone, its targets resolved against a model of `shape` (a regex must pick
// the same projections in every block). Throws RuntimeError naming the file and the key.
PeftAdapter read_peft_config(const std::string& dir, const LlamaShape& shape);
// The config and the tensors.
PeftAdapter read_peft(const std::string& dir, const LlamaShape& shape);
void write_peft(const std::string& dir, const PeftAdapter& adapter);

}  // namespace ptrain
