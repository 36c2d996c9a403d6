// `ptrain export --gguf`: a model as one GGUF file that llama.cpp (and Ollama, LM Studio) runs,
// written as llama.cpp's own converter (convert_hf_to_gguf.py) writes that model: its
// architecture's hyperparameter keys, its tensor names and layouts (Llama's q/k rows permuted
// to ggml's rotation layout), RoPE scaling, the tokenizer (byte-level BPE as `gpt2`: tokens,
// token types, merges, the pre-tokenizer's name; SentencePiece-style BPE as `llama`, with scores
// from the merge ranks; special ids, add_bos / add_eos) and the chat template. What GGUF or this writer cannot express
// is refused by name before a byte is written.
#pragma once
#include <string>

#include "checkpoint/gguf.h"

namespace ptrain {

// "f32" | "f16" | "bf16" | "q8_0"; throws UsageError naming the choices.
GgmlType gguf_type_named(const std::string& name);

// Writes the Hugging Face model directory `model_dir` (config.json + safetensors, float weights)
// with the tokenizer of `tokenizer_dir` (tokenizer.json, tokenizer_config.json, chat template) to
// `out` in `type` (norms, biases and RoPE factors stay float32, as llama.cpp's converter keeps
// them; a matrix whose rows Q8_0 cannot block goes as F16). Throws UnsupportedInput naming what
// cannot be expressed.
void write_gguf(const std::string& model_dir, const std::string& tokenizer_dir, const std::string& out, GgmlType type);

// The subcommand: a checkpoint (exported to a temporary Hugging Face directory first; a LoRA
// checkpoint merged, as --merge does) or a config's model.hf_path. Returns the exit code.
int run_export_gguf(const std::string& checkpoint_dir, const std::string& config_path, const std::string& out,
                    const std::string& type);

}  // namespace ptrain
