// Hugging Face model directories of the families in model/family.h: config.json -> LlamaShape,
// and the tensors of model.safetensors or of the shards listed in model.safetensors.index.json.
//
// config.json is read as transformers' code for the family reads it: every key that code reads is
// implemented, read without effect on the numbers, checked to change nothing at its value, or
// refused by name; every key it does not read is ignored and listed (hf_config_ignored_keys).
// Every tensor in the files is one the model consumes and every tensor the model needs is there
// with its shape and a floating-point dtype. Anything else is refused naming the key or tensor
// (UnsupportedInput, exit 2) — a model ptrain does not fully understand is never trained as a
// different network.
#pragma once
#include <ATen/Tensor.h>

#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "checkpoint/hf_config_file.h"
#include "checkpoint/safetensors.h"
#include "model/shape.h"
#include "quant/nf4.h"

namespace ptrain {

// Reads DIR's config file (hf_config_file) as transformers reads it (tests/unit/test_hf_config.cpp compares the two
// on ~1,500 variants). Throws UnsupportedInput naming the key (unknown family, a key that changes
// the computation in a way ptrain does not implement, a null or a combination transformers
// refuses or reads ambiguously) or RuntimeError (no file, bad JSON).
// A tied model (tie_word_embeddings) whose checkpoint holds lm_head.weight different from the
// embedding, both in one dtype, is read untied (tie_embeddings false), as transformers 5.23 loads
// it: those two tensors' values are read for it.
LlamaShape read_hf_config(const std::string& dir);
// A line for the log where read_hf_config read DIR untied (`tie_embeddings` false) although its
// config ties the embedding and head; "" otherwise.
std::string hf_untied_note(const std::string& dir, bool tie_embeddings);
// The same reading of a config.json already parsed (`config`; `path` names it in messages, `dir`
// is where a quantization_config's files would be): what a GGUF file's metadata becomes
// (checkpoint/gguf_model.h) goes through it too.
LlamaShape hf_config_shape(const nlohmann::json& config, const std::string& path, const std::string& dir = "");

// The keys of DIR/config.json that transformers' code for its family does not read: ignored, as
// transformers ignores them (names, versions, token ids it keeps for generation, ...).
std::vector<std::string> hf_config_ignored_keys(const std::string& dir);
// Those keys as a line for the log ("config.json keys ... ignored: a, b"); "" when there are none.
std::string hf_config_ignored_note(const std::string& dir);
// The config.json keys ptrain knows transformers' code reads for `family` (read, read without
// effect, neutral at some values, or refused): the table tests/unit compares with transformers.
std::vector<std::string> hf_config_keys_read(Family family);
// Whether `key` shapes the network transformers builds for `family` (read by ptrain, neutral only
// at some values, or refused); false for keys transformers reads without effect or does not read.
bool hf_config_key_shapes_network(const std::string& key, Family family);

// How config.json's `quantization_config` says the weights are stored. ptrain loads one kind of
// quantized checkpoint: bitsandbytes NF4 as transformers saves it (BitsAndBytesConfig(
// load_in_4bit=True, bnb_4bit_quant_type="nf4"), the "*-bnb-4bit" repositories): the seven
// projections of every block as packed 4-bit codes with their statistics, every other tensor in
// a float dtype. FP4, 8-bit (LLM.int8), GPTQ, AWQ and every other method or option are refused
// naming the key (UnsupportedInput).
struct HfStorage {
  bool nf4 = false;           // the projections are bitsandbytes NF4
  bool double_quant = false;  // with 8-bit absmax codes (bnb_4bit_use_double_quant)
};
HfStorage read_hf_storage(const std::string& dir);

// Writes DIR/config.json for `shape` in its family's format (float32 weights).
void write_hf_config(const std::string& dir, const LlamaShape& shape);

class HfCheckpoint {
 public:
  // Opens the weight file transformers' from_pretrained loads: the one config.json's
  // transformers_weights names, else model.safetensors, else every shard named by
  // model.safetensors.index.json, else pytorch_model.bin, else the shards of
  // pytorch_model.bin.index.json (checkpoint/torch_bin.h) — headers only: no tensor data is read. The index and the
  // shards must agree: every tensor the index maps lies in its file, and every tensor of a shard is mapped there.
  // `tied_embeddings` (config.json's tie_word_embeddings, as read): a checkpoint holding the head
  // but not the embedding is read with the head as the embedding, as transformers ties a pair
  // whose source the checkpoint lacks to the one it holds.
  explicit HfCheckpoint(const std::string& dir, bool tied_embeddings = false);
  // The stored tensor (any dtype, read-only view over the mapping).
  at::Tensor tensor(const std::string& name) const;
  const SafetensorsEntry& entry(const std::string& name) const;
  // The tensors by the names transformers loads them as into the family's causal LM: a base
  // model's save ("layers.0.…", no "model." prefix) is read as its body; a name with a prefix
  // too many loses it (HfCheckpoint's constructor; two stored tensors under one name refused).
  std::vector<std::string> names() const;
  // The name tensor `name` is stored under in the files (where it differs: `name` otherwise).
  std::string stored_name(const std::string& name) const;
  // A line for the log where some tensors are read under another name than they are stored
  // under ("" where none is): how many, and the first.
  std::string renamed_note() const;
  // tensor() as a function, for FsdpModel::load (valid while this checkpoint is).
  std::function<at::Tensor(const std::string&)> by_name() const {
    return [this](const std::string& name) { return tensor(name); };
  }

 private:
  std::string dir_;
  std::map<std::string, std::shared_ptr<WeightFile>> files_;  // by file name
  std::map<std::string, std::shared_ptr<WeightFile>> where_;  // tensor -> file
  std::map<std::string, std::string> stored_;                 // tensor -> stored name, where they differ
};

// Checks that `ckpt` holds exactly the tensors a model of `shape` consumes, each with its shape
// and a floating-point dtype (F32, BF16, F16) — with `storage.nf4`, each projection as the six
// tensors bitsandbytes saves for it (read_bnb_nf4; their values checked with `compare_values`). Two redundant tensors
// are accepted when they say nothing new: lm_head.weight of a tied model equal to the embedding, and the
// rotary_emb.inv_freq buffers older transformers saved, equal to the frequencies `shape` gives —
// their values are compared when `compare_values` (it reads them; `ptrain check` reads headers
// only). Throws UnsupportedInput listing every problem.
void verify_hf_tensors(const HfCheckpoint& ckpt, const LlamaShape& shape, const HfStorage& storage,
                       bool compare_values);

// The bitsandbytes NF4 weight `weight` ("model.layers.0.self_attn.q_proj.weight", of `shape`) as
// stored: the packed codes, absmax (8-bit codes with double quantization), nested_absmax and the
// mean from its quant_state, viewed over the mapped file (not copied, not requantized). Refuses,
// naming the tensor, a quant_state that is not NF4 in blocks of 64 (256 for the statistics) of
// this shape, a quant_map other than NF4's or a nested_quant_map other than the signed dynamic map.
// The tensors transformers saves for a bitsandbytes NF4 weight `weight` of `numel` elements,
// by name: their safetensors dtype and shape (quant_state: a JSON blob, U8 of any length, -1).
struct StoredTensor {
  std::string dtype;
  std::vector<int64_t> shape;
};
std::map<std::string, StoredTensor> bnb_nf4_tensors(const std::string& weight, int64_t numel, bool double_quant);
nf4::Quantized read_bnb_nf4(const HfCheckpoint& ckpt, const std::string& weight, const std::vector<int64_t>& shape,
                            bool double_quant);

}  // namespace ptrain
