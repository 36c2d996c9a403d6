// A GGUF file as the base model (`model.hf_path = "model.gguf"`, or a directory holding one GGUF
// file and no config.json), read as transformers' GGUF loader reads it
// (`AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)`, transformers 5.23):
//   - the config: `general.architecture` llama / qwen2 / qwen3 (llama.cpp's converter writes
//     Mistral as llama; one named exactly "mistral" transformers builds as Mistral and then fails
//     to load, llama.cpp runs as Llama: refused), the architecture's hyperparameter keys renamed to
//     config.json's (llama's `rope.dimension_count` is head_dim; qwen2 and qwen3 read no head
//     width: hidden / heads, and Qwen3Config's default 128), tied embeddings where the file has
//     no `output.weight`, the vocabulary from `tokenizer.ggml.tokens` where `vocab_size` is
//     absent, the special token ids (`tokenizer.ggml.padding_token_id` is pad_token_id: the
//     embedding row that receives no gradient) — then checked and read by the config.json reader (checkpoint/hf.h), so
//     a GGUF model and its HF directory give one shape;
//   - the tensors under llama.cpp's names, dequantized to float32 (quant/ggml_quants.h), Llama's
//     q/k rows put back in HF's order (llama.cpp's converter permutes them for its RoPE).
// What transformers drops but llama.cpp computes with — RoPE scaling (`rope.scaling.*`,
// `rope_freqs.weight`), Llama attention biases, heads of another width than the config's,
// experts, logit / attention / embedding scales, soft-capping — is refused by name (UnsupportedInput): the two
// readers of the file would run different networks. With llama.cpp's reading (GgufReader::llama_cpp,
// model.gguf_reader = "llama.cpp") the network is the one llama.cpp runs where ptrain builds it:
// rope_freqs as Llama 3.1's scaling (the parameters whose divisors they are), linear scaling,
// Llama's attention biases; the rest is refused as before. Metadata neither reads for the model
// (names, licences, quantization notes, file type) is ignored and listed (gguf_ignored_keys).
#pragma once
#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "model/options.h"
#include "model/shape.h"

namespace ptrain {

class GgufFile;
struct GgufTensorInfo;

// The GGUF file `hf_path` names: itself when it is a file that starts with GGUF's magic or ends
// in ".gguf", the one *.gguf file of a directory without config.json; "" for anything else (a
// Hugging Face directory). A directory holding several GGUF files and no config.json is refused
// listing them (UnsupportedInput): which one to train is the user's choice.
std::string gguf_model_file(const std::string& hf_path);

// llama.cpp's tensor names of a model of `shape`, in its converter's order: {GGUF name, HF name,
// heads to permute the rows by (Llama's q/k, 0 elsewhere)}. rope_freqs (Llama 3.1 scaling) is not
// among them: it is no HF tensor.
struct GgufTensorName {
  std::string gguf, hf;
  int64_t permute_heads = 0;
};
std::vector<GgufTensorName> gguf_tensor_names(const LlamaShape& shape);
// Llama 3.1's RoPE scaling of `s` as the frequency divisors llama.cpp reads from `rope_freqs.weight`
// (one per rotated pair), by its converter's formula (in double, stored as float32).
at::Tensor llama3_rope_divisors(const LlamaShape& s);

// llama.cpp's q/k row order (each head's pairs interleaved, for its "normal" RoPE) from HF's
// (each head's first half, then its second half) — and back (`inverse`).
at::Tensor permute_qk_rows(const at::Tensor& w, int64_t heads, bool inverse = false);

// A GGUF model opened for loading: its shape, and its tensors by HF name.
class GgufModel {
 public:
  // Reads the header; refuses as described above.
  explicit GgufModel(const std::string& path, GgufReader reader = GgufReader::transformers);
  ~GgufModel();
  GgufModel(const GgufModel&) = delete;
  GgufModel& operator=(const GgufModel&) = delete;

  const std::string& path() const;
  const LlamaShape& shape() const { return shape_; }
  // config.json as transformers' GGUF loader builds it from the metadata (what tests compare); with
  // llama.cpp's reading, plus what llama.cpp computes with (rope_scaling, attention_bias).
  const nlohmann::json& config() const { return *config_; }
  // Metadata keys ignored, as transformers' loader ignores them for the model.
  const std::vector<std::string>& ignored_keys() const { return ignored_; }
  std::string ignored_note() const;  // those keys as a log line; "" when there are none

  // The tensor of HF name `hf` as float32 in HF's layout (dequantized, q/k rows unpermuted).
  at::Tensor tensor(const std::string& hf) const;
  std::function<at::Tensor(const std::string&)> by_name() const {
    return [this](const std::string& name) { return tensor(name); };
  }
  // Every tensor the model of shape() needs is there with its shape in a type ptrain reads, and
  // every tensor of the file is one of them; UnsupportedInput listing each problem otherwise.
  void verify() const;

 private:
  std::unique_ptr<GgufFile> file_;
  std::unique_ptr<nlohmann::json> config_;
  LlamaShape shape_;
  std::vector<std::string> ignored_;
  std::map<std::string, GgufTensorName> by_hf_;  // HF name -> its GGUF name and permutation
  GgufReader reader_;
};

// The shape of `hf_path`'s model: a GGUF file's (GgufModel) or a Hugging Face directory's
// config.json (read_hf_config).
LlamaShape read_model_config(const std::string& hf_path, GgufReader reader = GgufReader::transformers);
// The log line of metadata / config.json keys ignored ("" when none).
std::string model_ignored_note(const std::string& hf_path, GgufReader reader = GgufReader::transformers);

}  // namespace ptrain
