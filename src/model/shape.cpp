#include "model/shape.h"

#include <cmath>
#include <iomanip>
#include <sstream>

namespace ptrain {

const std::vector<std::string>& rope_type_names() {
  static const std::vector<std::string> names{"llama3", "linear", "yarn"};  // RopeType's order
  return names;
}

const char* RopeScaling::type_name() const { return rope_type_names().at(static_cast<size_t>(type)).c_str(); }

double RopeScaling::yarn_mscale(double f, double m) { return f <= 1 ? 1.0 : 0.1 * m * std::log(f) + 1.0; }

std::optional<RopeType> rope_type_named(const std::string& name) {
  const auto& names = rope_type_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<RopeType>(i);
  return std::nullopt;
}

int64_t LlamaShape::block_params() const {
  const int64_t attn = dim * q_dim() + 2 * dim * kv_dim() + q_dim() * dim;
  const int64_t mlp = 3 * dim * ffn_dim;
  const int64_t biases =
      (qkv_bias() ? q_dim() + 2 * kv_dim() : 0) + (o_bias() ? dim : 0) + (mlp_biased() ? 2 * ffn_dim + dim : 0);
  return attn + mlp + 2 * dim + biases + (qk_norm() ? 2 * head_dim : 0);  // + RMSNorm weights
}

std::string LlamaShape::describe() const {
  std::vector<std::string> parts;
  if (qkv_bias()) parts.push_back(o_bias() ? "q/k/v/o biases" : "q/k/v biases");
  if (mlp_biased()) parts.push_back("MLP biases");
  if (qk_norm()) parts.push_back("per-head q/k RMSNorm");
  if (tie_embeddings) parts.push_back("tied embedding");
  if (sliding_window > 0) parts.push_back("sliding window of " + std::to_string(sliding_window) + " positions");
  if (rope_scaling.factor > 0 && rope_scaling.type != RopeType::llama3) {
    std::ostringstream f;
    f << rope_scaling.type_name() << " RoPE scaling x" << rope_scaling.factor;
    if (rope_scaling.type == RopeType::yarn)  // what the factor stretches, and what cos/sin are scaled by
      f << " of " << rope_scaling.original_max_seq_len << " positions, attention factor " << std::setprecision(4)
        << rope_scaling.attention_factor;
    parts.push_back(f.str());
  }
  std::string out = traits(family).name;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? ", " : " (") + parts[i] + (i + 1 == parts.size() ? ")" : "");
  return out;
}

int64_t LlamaShape::total_params() const { return embedding_params() + n_layers * block_params() + head_params(); }

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
  s.rope_scaling.factor = 8.0;  // low 1, high 4, original context 8192
  return s;
}
LlamaShape qwen(Family family, int64_t dim, int64_t layers, int64_t heads, int64_t kv_heads, int64_t head_dim,
                int64_t ffn, int64_t vocab, bool tied, int64_t max_positions) {
  LlamaShape s;
  s.family = family;
  s.dim = dim;
  s.n_layers = layers;
  s.n_heads = heads;
  s.n_kv_heads = kv_heads;
  s.head_dim = head_dim;
  s.ffn_dim = ffn;
  s.vocab_size = vocab;
  s.max_seq_len = max_positions;
  s.rope_theta = 1000000.0;
  s.norm_eps = 1e-6;
  s.tie_embeddings = tied;
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
  // Qwen2.5 (q/k/v biases; the small sizes tie their embeddings) and Qwen3 (q/k norms, head_dim
  // 128 whatever the width) as their config.json files on the Hugging Face Hub give them.
  if (name == "qwen2_5_0_5b") return qwen(Family::qwen2, 896, 24, 14, 2, 64, 4864, 151936, true, 32768);
  if (name == "qwen2_5_1_5b") return qwen(Family::qwen2, 1536, 28, 12, 2, 128, 8960, 151936, true, 32768);
  if (name == "qwen2_5_7b") return qwen(Family::qwen2, 3584, 28, 28, 4, 128, 18944, 152064, false, 32768);
  if (name == "qwen3_0_6b") return qwen(Family::qwen3, 1024, 28, 16, 8, 128, 3072, 151936, true, 40960);
  if (name == "qwen3_8b") return qwen(Family::qwen3, 4096, 36, 32, 8, 128, 12288, 151936, false, 40960);
  if (name == "mistral_7b") {  // Mistral 7B v0.3: vocabulary 32768, no sliding window
    LlamaShape s = llama3(4096, 32, 32, 14336);
    s.family = Family::mistral;
    s.vocab_size = 32768;
    s.max_seq_len = 32768;
    s.rope_theta = 1000000.0;
    s.rope_scaling = RopeScaling{};
    return s;
  }
  return std::nullopt;
}

std::vector<std::string> preset_names() {
  return {"tiny",         "llama3_2_1b", "llama3_8b",  "llama3_70b", "qwen2_5_0_5b",
          "qwen2_5_1_5b", "qwen2_5_7b",  "qwen3_0_6b", "qwen3_8b",   "mistral_7b"};
}

}  // namespace ptrain
