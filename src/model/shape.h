// Decoder hyper-parameters — the Llama block and the variations of its family
// (model/family.h) — and the named presets (the published Llama 3 / 3.2, Qwen2.5, Qwen3 and
// Mistral configurations).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "model/family.h"

namespace ptrain {

// RoPE frequency scaling, as HF config.json's rope_parameters / rope_scaling give it. Scaling
// applies where factor > 0; `type` says which (presets and [model] keys: llama3).
enum class RopeType {
  llama3,  // Llama 3.1: long wavelengths divided by factor, a smooth ramp between
  linear,  // every frequency divided by factor (position interpolation)
  yarn,    // YaRN: frequencies ramped between interpolated and original, cos/sin scaled
};
struct RopeScaling {
  RopeType type = RopeType::llama3;
  double factor = 0.0;                  // 0 disables scaling
  double low_freq_factor = 1.0;         // llama3
  double high_freq_factor = 4.0;        // llama3
  int64_t original_max_seq_len = 8192;  // llama3, yarn: the context the model was pretrained for
  double beta_fast = 32.0;              // yarn: the ramp's ends, in rotations over that context
  double beta_slow = 1.0;
  bool truncate = true;           // yarn: the ramp's ends rounded outward to whole dimensions
  double attention_factor = 1.0;  // yarn: cos and sin are multiplied by it
  const char* type_name() const;  // "llama3", "linear", "yarn"
  // YaRN's attention factor for a factor f where config.json gives none: 0.1 m ln(f) + 1 (1 for f <= 1).
  static double yarn_mscale(double f, double m = 1.0);
  // What RoPE's cos and sin are multiplied by: YaRN's attention factor, else 1.
  double table_scale() const { return factor > 0 && type == RopeType::yarn ? attention_factor : 1.0; }
};
// The types' names as config.json and the [model] keys spell them, in enumerator order.
const std::vector<std::string>& rope_type_names();
// The type spelled `name`; empty when unknown.
std::optional<RopeType> rope_type_named(const std::string& name);

// Upper bounds on a shape, far above every published model (Llama 3.1 405B: 126 layers, width
// 16,384, FFN 53,248; vocabularies up to 256k; contexts up to 10M) and low enough that a damaged
// config.json is refused instead of sizing loops and tables by it: with them, parameter counts
// and their bytes stay far inside int64.
inline constexpr int64_t kMaxLayers = 4096;
inline constexpr int64_t kMaxWidth = int64_t{1} << 20;  // dim, ffn_dim, heads, head_dim, heads × head_dim
inline constexpr int64_t kMaxVocab = int64_t{1} << 24;  // the tokenizer's id bound too
inline constexpr int64_t kMaxPositions = int64_t{1} << 26;

struct LlamaShape {
  int64_t dim = 0;  // hidden size
  int64_t n_layers = 0;
  int64_t n_heads = 0;     // query heads
  int64_t n_kv_heads = 0;  // key/value heads (GQA when < n_heads)
  int64_t head_dim = 0;    // dim / n_heads unless config.json says otherwise
  int64_t ffn_dim = 0;     // SwiGLU hidden size
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;  // longest sequence RoPE tables are built for
  double rope_theta = 500000.0;
  double norm_eps = 1e-5;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;
  Family family = Family::llama;
  bool attention_bias = false;  // config.json "attention_bias" (llama, qwen3: biases on q/k/v/o)
  bool mlp_bias = false;        // config.json "mlp_bias" (llama: biases on gate/up/down)
  // Attention limited to the last W positions, the token's own included (mistral: every layer);
  // 0: none. (Qwen2/3's per-layer windows, use_sliding_window = true, are refused.)
  int64_t sliding_window = 0;
  // The embedding row of config.json's pad_token_id, which receives no gradient (transformers
  // builds the embedding as nn.Embedding(vocab, dim, padding_idx=pad_token_id)); -1: none.
  int64_t padding_idx = -1;

  // The family's variations (model/family.h), resolved against the flags above.
  bool qkv_bias() const { return has(traits(family).qkv_bias); }
  bool o_bias() const { return has(traits(family).o_bias); }
  bool mlp_biased() const { return has(traits(family).mlp_bias); }
  bool qk_norm() const { return traits(family).qk_norm; }
  // "qwen3 (per-head q/k RMSNorm)": the family and what it adds to the Llama block.
  std::string describe() const;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t block_params() const;
  int64_t embedding_params() const { return vocab_size * dim; }
  // Parameters of final norm + output projection (the output is absent when tied).
  int64_t head_params() const { return dim + (tie_embeddings ? 0 : vocab_size * dim); }
  int64_t total_params() const;
  // Non-embedding parameters, for the 6N FLOPs/token estimate (output projection included).
  int64_t flops_params() const { return total_params() - embedding_params(); }

 private:
  bool has(BiasRule rule) const {
    return rule == BiasRule::always || (rule == BiasRule::attention_bias && attention_bias) ||
           (rule == BiasRule::mlp_bias && mlp_bias);
  }
};

// Known presets (preset_names()). Empty when unknown.
std::optional<LlamaShape> preset_shape(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace ptrain
