#include "model/shape.h"

namespace ptrain {

int64_t LlamaShape::block_params() const {
  const int64_t attn = dim * q_dim() + 2 * dim * kv_dim() + q_dim() * dim;
  const int64_t mlp = 3 * dim * ffn_dim;
  return attn + mlp + 2 * dim;  // + two RMSNorm weights
}

int64_t LlamaShape::total_params() const {
  return embedding_params() + n_layers * block_params() + head_params();
}

namespace {
LlamaShape llama3(int64_t dim, int64_t layers, int64_t heads, int64_t ffn) {
  LlamaShape s;
  s.dim = dim;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = 8;
  s.head_dim = dim / heads;
  s.ffn_dim = ffn;
  s.vocab_size = 128256;
  s.max_seq_len = 8192;
  s.rope_theta = 500000.0;
  s.norm_eps = 1e-5;
  s.rope_scaling = RopeScaling{8.0, 1.0, 4.0, 8192};
  return s;
}
}  // namespace

std::optional<LlamaShape> preset_shape(const std::string& name) {
  if (name == "tiny") {
    // ~12M parameters: trains visibly on 2 CPU cores in a few minutes on byte-level text.
    LlamaShape s;
    s.dim = 512;
    s.n_layers = 4;
    s.n_heads = 8;
    s.n_kv_heads = 4;
    s.head_dim = 64;
    s.ffn_dim = 1376;
    s.vocab_size = 256;
    s.max_seq_len = 1024;
    s.rope_theta = 10000.0;
    s.norm_eps = 1e-5;
    return s;
  }
  if (name == "llama3_8b") return llama3(4096, 32, 32, 14336);
  if (name == "llama3_70b") return llama3(8192, 80, 64, 28672);
  if (name == "llama3_2_1b") {  // Llama 3.2 1B: tied embedding, RoPE scaled by 32
    LlamaShape s = llama3(2048, 16, 32, 8192);
    s.tie_embeddings = true;
    s.rope_scaling.factor = 32.0;
    return s;
  }
  return std::nullopt;
}

std::vector<std::string> preset_names() { return {"tiny", "llama3_2_1b", "llama3_8b", "llama3_70b"}; }

}  // namespace ptrain
