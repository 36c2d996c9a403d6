#include "checkpoint/hf.h"

#include <filesystem>
#include <nlohmann/json.hpp>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
json read_json(const std::string& path) {
  try {
    return json::parse(read_text_file(path));
  } catch (const json::exception& e) {
    throw RuntimeError("'" + path + "' is not valid JSON: " + e.what());
  }
}
}  // namespace

LlamaShape read_hf_config(const std::string& dir) {
  const std::string path = (fs::path(dir) / "config.json").string();
  if (!fs::is_regular_file(path)) throw RuntimeError("no config.json in '" + dir + "' (expected a Hugging Face Llama directory)");
  json c = read_json(path);
  auto need = [&](const char* key) -> const json& {
    if (!c.contains(key) || c[key].is_null()) throw RuntimeError(path + ": missing \"" + key + "\"");
    return c[key];
  };
  try {
    LlamaShape s;
    s.dim = need("hidden_size").get<int64_t>();
    s.n_layers = need("num_hidden_layers").get<int64_t>();
    s.n_heads = need("num_attention_heads").get<int64_t>();
    s.n_kv_heads = c.value("num_key_value_heads", s.n_heads);
    s.head_dim = c.contains("head_dim") && !c["head_dim"].is_null() ? c["head_dim"].get<int64_t>()
                                                                     : (s.n_heads ? s.dim / s.n_heads : 0);
    s.ffn_dim = need("intermediate_size").get<int64_t>();
    s.vocab_size = need("vocab_size").get<int64_t>();
    s.max_seq_len = c.value("max_position_embeddings", int64_t{2048});
    s.rope_theta = c.value("rope_theta", 10000.0);
    s.norm_eps = c.value("rms_norm_eps", 1e-6);
    s.tie_embeddings = c.value("tie_word_embeddings", false);
    // transformers < 5 writes "rope_theta" + "rope_scaling"; 5.x writes "rope_parameters"
    // holding both.
    const json* rope = nullptr;
    if (c.contains("rope_parameters") && c["rope_parameters"].is_object()) {
      rope = &c["rope_parameters"];
      s.rope_theta = rope->value("rope_theta", s.rope_theta);
    } else if (c.contains("rope_scaling") && c["rope_scaling"].is_object()) {
      rope = &c["rope_scaling"];
    }
    if (rope) {
      const auto& r = *rope;
      const std::string type = r.value("rope_type", r.value("type", std::string("default")));
      if (type == "llama3") {
        s.rope_scaling.factor = r.at("factor").get<double>();
        s.rope_scaling.low_freq_factor = r.at("low_freq_factor").get<double>();
        s.rope_scaling.high_freq_factor = r.at("high_freq_factor").get<double>();
        s.rope_scaling.original_max_seq_len = r.at("original_max_position_embeddings").get<int64_t>();
      } else if (type != "default") {
        throw RuntimeError(path + ": rope type \"" + type + "\" is not supported (only \"default\" and \"llama3\")");
      }
    }
    if (c.value("hidden_act", std::string("silu")) != "silu")
      throw RuntimeError(path + ": hidden_act must be \"silu\" for a Llama model");
    return s;
  } catch (const json::exception& e) {
    throw RuntimeError(path + ": unexpected value: " + e.what());
  }
}

void write_hf_config(const std::string& dir, const LlamaShape& s) {
  json c = {
      {"architectures", {"LlamaForCausalLM"}},
      {"model_type", "llama"},
      {"hidden_size", s.dim},
      {"num_hidden_layers", s.n_layers},
      {"num_attention_heads", s.n_heads},
      {"num_key_value_heads", s.n_kv_heads},
      {"head_dim", s.head_dim},
      {"intermediate_size", s.ffn_dim},
      {"vocab_size", s.vocab_size},
      {"max_position_embeddings", s.max_seq_len},
      {"rope_theta", s.rope_theta},
      {"rms_norm_eps", s.norm_eps},
      {"tie_word_embeddings", s.tie_embeddings},
      {"hidden_act", "silu"},
      {"attention_bias", false},
      {"mlp_bias", false},
      {"torch_dtype", "float32"},
  };
  if (s.rope_scaling.factor > 0)
    c["rope_scaling"] = {{"rope_type", "llama3"},
                         {"factor", s.rope_scaling.factor},
                         {"low_freq_factor", s.rope_scaling.low_freq_factor},
                         {"high_freq_factor", s.rope_scaling.high_freq_factor},
                         {"original_max_position_embeddings", s.rope_scaling.original_max_seq_len}};
  else
    c["rope_scaling"] = nullptr;
  write_file_atomic((fs::path(dir) / "config.json").string(), c.dump(2) + "\n");
}

HfCheckpoint::HfCheckpoint(const std::string& dir) : dir_(dir) {
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  const fs::path single = fs::path(dir) / "model.safetensors";
  auto open = [&](const std::string& file) {
    auto it = files_.find(file);
    if (it != files_.end()) return it->second;
    const fs::path p = fs::path(dir) / file;
    if (fs::path(file).has_parent_path() || !fs::is_regular_file(p))
      throw RuntimeError("'" + dir + "': weight file '" + file + "' is missing");
    return files_[file] = std::make_shared<SafetensorsFile>(p.string());
  };
  if (fs::is_regular_file(index)) {
    json j = read_json(index.string());
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      throw RuntimeError(index.string() + ": missing \"weight_map\"");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string()) throw RuntimeError(index.string() + ": weight_map value for '" + it.key() + "' is not a file name");
      auto file = open(it->get<std::string>());
      if (!file->contains(it.key()))
        throw RuntimeError(index.string() + " maps '" + it.key() + "' to " + it->get<std::string>() + ", which lacks it");
      where_[it.key()] = file;
    }
  } else if (fs::is_regular_file(single)) {
    auto file = open("model.safetensors");
    for (const auto& e : file->entries()) where_[e.name] = file;
  } else {
    throw RuntimeError("'" + dir + "' has neither model.safetensors nor model.safetensors.index.json");
  }
}

at::Tensor HfCheckpoint::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw RuntimeError("HF checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  return it->second->tensor(name);
}

}  // namespace ptrain
