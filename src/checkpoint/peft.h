// LoRA adapters in PEFT's format: <dir>/adapter_config.json (peft_type LORA, r, lora_alpha,
// lora_dropout, target_modules, ...) and <dir>/adapter_model.safetensors with keys
// "base_model.model.<ptrain slot name>", e.g.
// "base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight" [r, in] and ...lora_B.weight
// [out, r] — what `PeftModel.from_pretrained` loads and `save_pretrained` writes.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace ptrain {

struct PeftAdapter {
  int64_t rank = 0;
  double alpha = 0.0;
  double dropout = 0.0;
  std::vector<std::string> targets;           // ptrain's names: q, k, v, o, gate, up, down
  std::map<std::string, at::Tensor> tensors;  // by ptrain slot name ("model.layers.0....lora_A.weight")
  std::string base_model;                     // base_model_name_or_path
};

// Throws RuntimeError naming the file and the problem.
PeftAdapter read_peft(const std::string& dir);
void write_peft(const std::string& dir, const PeftAdapter& adapter);

}  // namespace ptrain
