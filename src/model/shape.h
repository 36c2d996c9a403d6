// Llama architecture hyper-parameters and the named presets (Meta's published Llama 3 / 3.2 configurations).
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace ptrain {

// Llama-3.1 style RoPE frequency scaling ("rope_type": "llama3" in HF config.json).
struct RopeScaling {
  double factor = 0.0;            // 0 disables scaling
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  int64_t original_max_seq_len = 8192;
};

struct LlamaShape {
  int64_t dim = 0;          // hidden size
  int64_t n_layers = 0;
  int64_t n_heads = 0;      // query heads
  int64_t n_kv_heads = 0;   // key/value heads (GQA when < n_heads)
  int64_t head_dim = 0;     // dim / n_heads unless config.json says otherwise
  int64_t ffn_dim = 0;      // SwiGLU hidden size
  int64_t vocab_size = 0;
  int64_t max_seq_len = 0;  // longest sequence RoPE tables are built for
  double rope_theta = 500000.0;
  double norm_eps = 1e-5;
  RopeScaling rope_scaling;
  bool tie_embeddings = false;

  int64_t q_dim() const { return n_heads * head_dim; }
  int64_t kv_dim() const { return n_kv_heads * head_dim; }
  int64_t block_params() const;
  int64_t embedding_params() const { return vocab_size * dim; }
  // Parameters of final norm + output projection (the output is absent when tied).
  int64_t head_params() const { return dim + (tie_embeddings ? 0 : vocab_size * dim); }
  int64_t total_params() const;
  // Non-embedding parameters, for the 6N FLOPs/token estimate (output projection included).
  int64_t flops_params() const { return total_params() - embedding_params(); }
};

// Known presets: "tiny" (CPU demo), "llama3_8b", "llama3_70b". Empty when unknown.
std::optional<LlamaShape> preset_shape(const std::string& name);
std::vector<std::string> preset_names();

}  // namespace ptrain
