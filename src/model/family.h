// The model families ptrain implements, as variations of one decoder (the Llama block:
// RMSNorm, RoPE, GQA attention, SwiGLU). One row per family says what it changes; everything
// that differs between families reads this table, nothing tests a family by name.
//
//   family   HF model_type / architecture    q/k/v bias        o bias            MLP bias   q/k RMSNorm
//   llama    llama / LlamaForCausalLM        attention_bias    attention_bias    mlp_bias   no
//   mistral  mistral / MistralForCausalLM    no                no                no         no
//   qwen2    qwen2 / Qwen2ForCausalLM        yes               no                no         no
//   qwen3    qwen3 / Qwen3ForCausalLM        attention_bias    attention_bias    no         yes (per head, before RoPE)
//
// Mistral's sliding window (every layer sees the last sliding_window positions) is implemented;
// Qwen2/3's (use_sliding_window = true: windows on the layers from max_window_layers on, which no
// released Qwen model sets) is refused.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ptrain {

enum class Family { llama, mistral, qwen2, qwen3 };

// Whether a family's projections carry a bias: never, always, or as a config flag says.
enum class BiasRule { never, always, attention_bias, mlp_bias };

struct FamilyTraits {
  Family family;
  const char* name;          // model.family and config.json's "model_type"
  const char* architecture;  // config.json's "architectures" entry (the causal-LM class)
  const char* base_model;    // the base model's class, which a save of the body alone names
  BiasRule qkv_bias, o_bias, mlp_bias;
  bool qk_norm;  // RMSNorm over each head of q and k (weights [head_dim]) before RoPE
  // What transformers assumes when config.json omits a key (its config class's defaults).
  int64_t default_kv_heads;        // num_key_value_heads; 0: the query heads
  int64_t default_head_dim;        // head_dim; 0: hidden_size / num_attention_heads
  int64_t default_sliding_window;  // mistral's sliding_window; 0: none
  int64_t default_max_positions;   // max_position_embeddings
  // Keys whose null transformers reads as "derive it" (the query heads, hidden_size / heads, no
  // window); a null anywhere else is a value transformers refuses, and so does ptrain.
  std::vector<std::string> nullable_keys;
  // Whether transformers' config class refuses a hidden_size that is not a multiple of
  // num_attention_heads even when head_dim is given (LlamaConfig.validate_architecture).
  bool heads_divide_width;
};

const std::vector<FamilyTraits>& families();
const FamilyTraits& traits(Family family);
std::optional<Family> family_named(const std::string& name);
// "llama, mistral, qwen2, qwen3"
std::string family_names();

}  // namespace ptrain
