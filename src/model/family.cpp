#include "model/family.h"

#include <stdexcept>

namespace ptrain {

const std::vector<FamilyTraits>& families() {
  // From transformers 5.x's modeling files: LlamaAttention/LlamaMLP (bias flags), Mistral (the
  // Llama decoder with a sliding window), Qwen2Attention (q/k/v bias=True, o bias=False),
  // Qwen3Attention (q_norm/k_norm over head_dim, bias=attention_bias; Qwen3MLP has none).
  static const std::vector<FamilyTraits> kFamilies = {
      {Family::llama,
       "llama",
       "LlamaForCausalLM",
       "LlamaModel",
       BiasRule::attention_bias,
       BiasRule::attention_bias,
       BiasRule::mlp_bias,
       false,
       0,
       0,
       0,
       2048,
       {"num_key_value_heads", "head_dim"},
       true},
      {Family::mistral,
       "mistral",
       "MistralForCausalLM",
       "MistralModel",
       BiasRule::never,
       BiasRule::never,
       BiasRule::never,
       false,
       8,
       0,
       4096,
       131072,
       {"head_dim", "sliding_window"},
       false},
      {Family::qwen2,
       "qwen2",
       "Qwen2ForCausalLM",
       "Qwen2Model",
       BiasRule::always,
       BiasRule::never,
       BiasRule::never,
       false,
       32,
       0,
       0,
       32768,
       {"num_key_value_heads", "sliding_window", "layer_types"},
       false},
      {Family::qwen3,
       "qwen3",
       "Qwen3ForCausalLM",
       "Qwen3Model",
       BiasRule::attention_bias,
       BiasRule::attention_bias,
       BiasRule::never,
       true,
       32,
       128,
       0,
       32768,
       {"num_key_value_heads", "sliding_window", "layer_types"},
       false},
  };
  return kFamilies;
}

const FamilyTraits& traits(Family family) {
  for (const auto& f : families())
    if (f.family == family) return f;
  throw std::logic_error("family missing from the family table");
}

std::optional<Family> family_named(const std::string& name) {
  for (const auto& f : families())
    if (name == f.name) return f.family;
  return std::nullopt;
}

std::string family_names() {
  std::string out;
  for (const auto& f : families()) out += (out.empty() ? "" : ", ") + std::string(f.name);
  return out;
}

}  // namespace ptrain
