#include "checkpoint/hf.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint/torch_bin.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"
#include "model/layout.h"
#include "model/llama.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// How ptrain treats a config.json key that transformers' code reads for a family.
enum class KeyUse {
  read,       // implemented: read_hf_config reads it
  no_effect,  // transformers reads it without changing the trained network's numbers (`why`)
  neutral,    // changes nothing at the values neutral() accepts; refused at any other
  refused,    // describes what ptrain does not implement (`why`)
};
struct ConfigKey {
  const char* key;
  KeyUse use;
  std::vector<Family> only = {};  // the families whose code reads it; empty: every family
  const char* why = "";
};

// The config.json keys transformers 5.23's code reads for each family: every attribute its
// causal LM reads while it is built, trained (forward with labels, backward) and run with a KV
// cache, and every one its config class reads itself, as tests/fixtures/derive_hf_keys.py records
// them (tests/fixtures/hf_keys_read.json; HfKeys.ConfigTableNamesEveryKeyTransformersReads checks
// that this table names each). A key transformers does not read for the family is ignored, as
// transformers ignores it, and listed by hf_config_ignored_keys(). rope_scaling and torch_dtype
// are the names transformers 4.x wrote for rope_parameters and dtype.
const std::vector<ConfigKey>& config_keys() {
  using F = Family;
  static const std::vector<ConfigKey> k{
      {"architectures", KeyUse::read},
      {"model_type", KeyUse::read},
      {"hidden_size", KeyUse::read},
      {"num_hidden_layers", KeyUse::read},
      {"num_attention_heads", KeyUse::read},
      {"num_key_value_heads", KeyUse::read},
      {"head_dim", KeyUse::read},
      {"intermediate_size", KeyUse::read},
      {"vocab_size", KeyUse::read},
      {"max_position_embeddings", KeyUse::read},
      {"rope_theta", KeyUse::read},
      {"rope_parameters", KeyUse::read},
      {"rope_scaling", KeyUse::read},
      {"original_max_position_embeddings", KeyUse::read},
      {"rms_norm_eps", KeyUse::read},
      {"tie_word_embeddings", KeyUse::read},
      {"hidden_act", KeyUse::read},
      {"attention_dropout", KeyUse::read},
      {"pad_token_id", KeyUse::read},
      {"transformers_weights", KeyUse::read},  // the weight file from_pretrained loads (HfCheckpoint)
      {"configuration_files", KeyUse::read},   // the config file from_pretrained reads (hf_config_file)
      {"quantization_config", KeyUse::read},
      {"attention_bias", KeyUse::read, {F::llama, F::qwen3}},
      {"mlp_bias", KeyUse::read, {F::llama}},
      {"sliding_window", KeyUse::read, {F::mistral}},
      {"sliding_window", KeyUse::neutral, {F::llama}},
      {"sliding_window",
       KeyUse::no_effect,
       {F::qwen2, F::qwen3},
       "it sizes the window of the layers layer_types marks sliding, which ptrain refuses"},
      {"use_sliding_window", KeyUse::read, {F::qwen2, F::qwen3}},
      {"max_window_layers",
       KeyUse::no_effect,
       {F::qwen2, F::qwen3},
       "it picks the layers use_sliding_window windows, which ptrain refuses"},
      {"layer_types", KeyUse::read, {F::qwen2, F::qwen3}},
      {"layer_types", KeyUse::neutral, {F::llama, F::mistral}},
      {"partial_rotary_factor", KeyUse::neutral},
      {"attention_chunk_size", KeyUse::neutral},
      {"kv_sharing_modes", KeyUse::neutral},
      {"is_causal", KeyUse::neutral},
      {"is_encoder_decoder", KeyUse::neutral},
      {"text_config", KeyUse::neutral},
      {"decoder", KeyUse::neutral},
      {"generator", KeyUse::neutral},
      {"fusion_config", KeyUse::neutral},  // from_pretrained fuses modules as it says (inference only)
      {"mtp_layer_types", KeyUse::read},   // checked (read_unused_layer_types): no layer of these families reads it
      {"mlp_layer_types", KeyUse::read, {F::qwen2, F::qwen3}},  // the same
      {"auto_map", KeyUse::refused, {}, "the model ships its own modeling code, which ptrain cannot check"},
      {"_name_or_path", KeyUse::no_effect, {}, "the name it was saved from"},
      {"dtype", KeyUse::no_effect, {}, "the dtype transformers loads weights in; ptrain's [precision] decides"},
      {"torch_dtype", KeyUse::no_effect, {}, "dtype's name in transformers 4.x"},
      {"use_cache", KeyUse::no_effect, {}, "whether inference keeps a KV cache: the same numbers"},
      {"transformers_version", KeyUse::no_effect, {}, "the version that saved it"},
      {"bos_token_id", KeyUse::no_effect, {}, "a default of generation, not of the network"},
      {"eos_token_id", KeyUse::no_effect, {}, "a default of generation, not of the network"},
      {"id2label", KeyUse::no_effect, {}, "the labels of a classification head, which a causal LM lacks"},
      {"label2id", KeyUse::no_effect, {}, "the labels of a classification head, which a causal LM lacks"},
      {"problem_type", KeyUse::no_effect, {}, "the loss of a classification head, which a causal LM lacks"},
      {"chunk_size_feed_forward", KeyUse::no_effect, {}, "read by no layer of these families"},
      {"num_heads",
       KeyUse::no_effect,
       {F::mistral, F::qwen3},
       "checked against embed_dim only, a key these families do not have"},
      {"pretraining_tp",
       KeyUse::no_effect,
       {F::llama},
       "transformers 5's Llama forward does not read it (4.x cut the projections into as many matmuls)"},
      {"output_hidden_states", KeyUse::no_effect, {}, "what the forward returns, not what it computes"},
      {"return_dict", KeyUse::no_effect, {}, "what the forward returns, not what it computes"},
      {"gradient_checkpointing", KeyUse::no_effect, {}, "memory, not numbers"},
      {"initializer_range",
       KeyUse::no_effect,
       {},
       "the init of weights the checkpoint lacks; ptrain loads every weight or refuses the directory"},
      {"vision_aspect_ratio", KeyUse::no_effect, {}, "a default of vision models' forward, which a causal LM's lacks"},
      {"vision_feature_layer", KeyUse::no_effect, {}, "a default of vision models' forward, which a causal LM's lacks"},
      {"vision_feature_select_strategy",
       KeyUse::no_effect,
       {},
       "a default of vision models' forward, which a causal LM's lacks"},
  };
  return k;
}

// The rule for `key` in family `f`, or null where transformers does not read it.
const ConfigKey* config_key(const std::string& key, Family f) {
  for (const auto& k : config_keys())
    if (key == k.key && (k.only.empty() || std::find(k.only.begin(), k.only.end(), f) != k.only.end())) return &k;
  return nullptr;
}

// Whether a key that changes nothing at some values holds one of them.
bool neutral(const std::string& key, const json& v) {
  if (key == "partial_rotary_factor") return v.is_null() || (v.is_number() && v.get<double>() == 1.0);
  if (key == "is_causal") return v.is_null() || v == json(true);
  if (key == "is_encoder_decoder") return v.is_null() || v == json(false);
  if (key == "attn_logit_softcapping" || key == "final_logit_softcapping") return v.is_null();
  return v.is_null();  // sliding_window, layer_types, attention_chunk_size, kv_sharing_modes, sub-configs
}

// Whether null is a value transformers reads for `key` in family `f` (RoPE: the default;
// architectures: none named; pad_token_id: no padding row; original_max_position_embeddings:
// max_position_embeddings; the family's own list: derive it).
bool nullable(const FamilyTraits& f, const std::string& key) {
  return key == "rope_parameters" || key == "rope_scaling" || key == "architectures" || key == "pad_token_id" ||
         key == "original_max_position_embeddings" || key == "transformers_weights" || key == "mtp_layer_types" ||
         key == "mlp_layer_types" ||
         std::find(f.nullable_keys.begin(), f.nullable_keys.end(), key) != f.nullable_keys.end();
}

// Why a key ptrain does not read would make it a different network, where a word helps.
std::string refusal_hint(const std::string& key) {
  if (key == "auto_map") return "the model ships its own modeling code, which ptrain cannot check against its families";
  if (key.find("expert") != std::string::npos || key.find("moe") != std::string::npos)
    return "mixture-of-experts layers are not implemented";
  if (key.find("softcap") != std::string::npos) return "logit soft-capping is not implemented";
  if (key == "partial_rotary_factor") return "partial rotary embeddings are not implemented";
  return "ptrain does not implement it, so the network would differ from the one this key describes";
}

std::string family_list() {
  std::string out;
  for (const auto& f : families()) out += std::string(out.empty() ? "" : ", ") + f.name + " (" + f.architecture + ")";
  return out;
}

// YaRN's parameters as transformers reads them: `factor` null is max_position_embeddings over
// the original length; beta_fast / beta_slow null or 0 are 32 / 1; truncate defaults to true;
// attention_factor, where not given, is 0.1 ln(factor) + 1 — or the ratio of that with mscale and
// with mscale_all_dim where both are given and nonzero (mscale alone changes nothing).
template <class Number>
void read_yarn(const json& r, RopeScaling& out, int64_t max_positions, int64_t original, Number&& number,
               const std::string& where) {
  out.type = RopeType::yarn;
  out.original_max_seq_len = original;
  if (!r.contains("factor")) throw UnsupportedInput(where + ".factor is missing (RoPE type \"yarn\" needs it)");
  const auto factor = number("factor");
  if (!factor && original <= 0) throw UnsupportedInput(where + ".original_max_position_embeddings must be positive");
  out.factor = factor ? *factor : static_cast<double>(max_positions) / static_cast<double>(original);
  auto beta = [&](const char* name, double fallback) {
    const auto v = number(name);
    if (v && *v < 0) throw UnsupportedInput(where + "." + name + " = " + r[name].dump() + " is negative");
    return v && *v != 0 ? *v : fallback;
  };
  out.beta_fast = beta("beta_fast", 32.0);
  out.beta_slow = beta("beta_slow", 1.0);
  if (out.beta_fast < out.beta_slow)
    throw UnsupportedInput(where + ": beta_fast (" + json(out.beta_fast).dump() + ") is below beta_slow (" +
                           json(out.beta_slow).dump() + "); the ramp would run backwards (transformers warns)");
  if (r.contains("truncate")) {
    if (!r["truncate"].is_boolean()) throw UnsupportedInput(where + ".truncate must be true or false");
    out.truncate = r["truncate"].get<bool>();
  }
  const auto given = number("attention_factor");
  const auto m = number("mscale"), m_all = number("mscale_all_dim");
  if (given) {
    if (!(*given > 0)) throw UnsupportedInput(where + ".attention_factor must be positive");
    out.attention_factor = *given;
  } else if (m && *m != 0 && m_all && *m_all != 0) {
    out.attention_factor = RopeScaling::yarn_mscale(out.factor, *m) / RopeScaling::yarn_mscale(out.factor, *m_all);
  } else {
    out.attention_factor = RopeScaling::yarn_mscale(out.factor);
  }
}

void read_rope(const json& c, LlamaShape& s, const std::string& path) {
  // transformers < 5 writes "rope_theta" + "rope_scaling"; 5.x writes "rope_parameters" holding both.
  // Where a file holds both, transformers reads rope_scaling and drops rope_parameters (its
  // rope_theta too): such a file is refused rather than read either way. An empty object is absent.
  if (c.contains("rope_theta")) s.rope_theta = c["rope_theta"].get<double>();
  const json* rope = nullptr;
  std::string key;
  for (const char* k : {"rope_parameters", "rope_scaling"}) {
    if (!c.contains(k) || c[k].is_null()) continue;
    if (!c[k].is_object()) throw UnsupportedInput(path + ": \"" + k + "\" must be an object or null");
    if (c[k].empty()) continue;
    if (rope)
      throw UnsupportedInput(path +
                             ": both \"rope_parameters\" and \"rope_scaling\" are set; transformers reads "
                             "rope_scaling and ignores rope_parameters (its rope_theta too). Keep the one "
                             "that describes the model (transformers 5 writes rope_parameters)");
    rope = &c[k];
    key = k;
  }
  if (!rope) return;
  const json& r = *rope;
  const std::string type = r.value("rope_type", r.value("type", std::string("default")));
  std::set<std::string> known{"rope_type", "type", "rope_theta"};
  RopeScaling& out = s.rope_scaling;
  // A number at `name` (known from here on); empty where absent or null.
  auto number = [&](const char* name) -> std::optional<double> {
    known.insert(name);
    if (!r.contains(name) || r[name].is_null()) return std::nullopt;
    if (!r[name].is_number())
      throw UnsupportedInput(path + ": " + key + "." + name + " = " + r[name].dump() + " is not a number");
    return r[name].get<double>();
  };
  auto need = [&](const char* name) {
    const auto v = number(name);
    if (!v)
      throw UnsupportedInput(path + ": " + key + "." + name + " is missing (RoPE type \"" + type + "\" needs it)");
    return *v;
  };
  // Where it is absent, transformers takes the pretraining length to be max_position_embeddings;
  // a top-level original_max_position_embeddings (as Phi-3 writes it) comes first.
  auto original_length = [&] {
    known.insert("original_max_position_embeddings");
    if (c.contains("original_max_position_embeddings") && !c["original_max_position_embeddings"].is_null())
      return json_integer(c["original_max_position_embeddings"], path + ": original_max_position_embeddings");
    return r.contains("original_max_position_embeddings")
               ? json_integer(r["original_max_position_embeddings"],
                              path + ": " + key + ".original_max_position_embeddings")
               : s.max_seq_len;
  };
  if (type == "llama3") {
    out.type = RopeType::llama3;
    out.factor = need("factor");
    out.low_freq_factor = need("low_freq_factor");
    out.high_freq_factor = need("high_freq_factor");
    out.original_max_seq_len = original_length();
  } else if (type == "linear") {
    out.type = RopeType::linear;
    out.factor = need("factor");
  } else if (type == "yarn") {
    read_yarn(r, out, s.max_seq_len, original_length(), number, path + ": " + key);
    known.insert("truncate");  // the one key of YaRN's that is not a number
  } else if (type != "default") {
    throw UnsupportedInput(
        path + ": " + key + ".rope_type \"" + type +
        "\" is not implemented (ptrain implements \"default\", \"llama3\", \"linear\" and \"yarn\")");
  }
  if (r.contains("rope_theta")) s.rope_theta = r["rope_theta"].get<double>();
  for (auto it = r.begin(); it != r.end(); ++it)
    if (!known.count(it.key()) && !neutral(it.key(), it.value()))
      throw UnsupportedInput(path + ": " + key + "." + it.key() + " is not part of RoPE type \"" + type +
                             "\" as ptrain implements it; " + refusal_hint(it.key()));
}

// Qwen's sliding-window keys: a window only where use_sliding_window is true (on the layers from
// max_window_layers on), which ptrain refuses: its window is Mistral's, on every layer.
void read_qwen_window(const json& c, LlamaShape& s, const std::string& path) {
  if (c.value("use_sliding_window", false))
    throw UnsupportedInput(path + ": use_sliding_window = true: sliding-window attention is not implemented for " +
                           traits(s.family).name + " (released Qwen models set it false)");
  if (c.contains("layer_types") && !c["layer_types"].is_null()) {
    const json& types = c["layer_types"];
    if (!types.is_array() || static_cast<int64_t>(types.size()) != s.n_layers)
      throw UnsupportedInput(path + ": layer_types must list one type per layer (" + std::to_string(s.n_layers) + ")");
    for (const auto& t : types)
      if (t != "full_attention")
        throw UnsupportedInput(path + ": layer_types holds " + t.dump() +
                               "; ptrain implements \"full_attention\" layers only");
  }
}

// pad_token_id as transformers' nn.Embedding(vocab, dim, padding_idx=pad_token_id) takes it: that
// row gets no gradient; a negative one counts from the end (PyTorch's rule); -1 for none.
int64_t read_padding_idx(const json& c, int64_t vocab, const std::string& path) {
  if (!c.contains("pad_token_id") || c["pad_token_id"].is_null()) return -1;
  const int64_t pad = json_integer(c["pad_token_id"], path + ": pad_token_id");
  if (pad >= vocab || pad < -vocab)
    throw UnsupportedInput(path + ": pad_token_id " + std::to_string(pad) +
                           " is not a row of the embedding (vocab_size " + std::to_string(vocab) +
                           "); transformers' nn.Embedding refuses it too");
  return pad < 0 ? vocab + pad : pad;
}

// Layer-type lists transformers checks but no layer of these families reads: the types of
// multi-token-prediction layers (remapped, never built) and, for Qwen, each layer's MLP kind
// (validated as "sparse" / "dense", one a layer; Qwen2/3 build the same dense MLP either way).
// The network is the same at every value transformers accepts; a value it fails on is refused.
void read_unused_layer_types(const json& c, const LlamaShape& s, const std::string& path) {
  auto strings = [&](const char* key) -> const json* {
    if (!c.contains(key) || c[key].is_null()) return nullptr;
    const json& v = c[key];
    if (!v.is_array() || !std::all_of(v.begin(), v.end(), [](const json& t) { return t.is_string(); }))
      throw UnsupportedInput(path + ": \"" + key + "\" = " + v.dump() + ": transformers reads a list of layer " +
                             "types there (ptrain reads a list of strings, or null)");
    return &v;
  };
  strings("mtp_layer_types");
  if (s.family != Family::qwen2 && s.family != Family::qwen3) return;
  if (const json* mlp = strings("mlp_layer_types")) {
    for (const json& t : *mlp)
      if (t != "sparse" && t != "dense")
        throw UnsupportedInput(path + ": \"mlp_layer_types\" holds " + t.dump() +
                               ", which transformers refuses (each entry is \"sparse\" or \"dense\")");
    if (static_cast<int64_t>(mlp->size()) != s.n_layers)
      throw UnsupportedInput(path + ": \"mlp_layer_types\" has " + std::to_string(mlp->size()) +
                             " entries for num_hidden_layers " + std::to_string(s.n_layers) +
                             ", which transformers refuses (one a layer)");
  }
}

// Mistral: the window applies to every layer; transformers' default is 4096 when the key is absent.
void read_mistral_window(const json& c, LlamaShape& s, const std::string& path) {
  s.sliding_window = traits(s.family).default_sliding_window;
  if (c.contains("sliding_window"))
    s.sliding_window = c["sliding_window"].is_null() ? 0 : json_integer(c["sliding_window"], path + ": sliding_window");
}
}  // namespace

std::vector<std::string> hf_config_ignored_keys(const std::string& dir) {
  const json c = read_json_file(hf_config_file(dir));
  const auto family = c.is_object() && c.contains("model_type") && c["model_type"].is_string()
                          ? family_named(c["model_type"].get<std::string>())
                          : std::nullopt;
  std::vector<std::string> out;
  if (family)
    for (auto it = c.begin(); it != c.end(); ++it)
      if (!config_key(it.key(), *family)) out.push_back(it.key());
  return out;
}

std::string hf_config_ignored_note(const std::string& dir) {
  std::string keys;
  for (const auto& k : hf_config_ignored_keys(dir)) keys += (keys.empty() ? "" : ", ") + k;
  return keys.empty() ? keys
                      : hf_config_file(dir) +
                            " keys transformers' model code does not read, ignored as it ignores them: " + keys;
}

bool hf_config_key_shapes_network(const std::string& key, Family family) {
  const ConfigKey* rule = config_key(key, family);
  return rule && rule->use != KeyUse::no_effect;
}

std::vector<std::string> hf_config_keys_read(Family family) {
  std::vector<std::string> out;
  for (const auto& k : config_keys())
    if (config_key(k.key, family) == &k) out.push_back(k.key);
  return out;
}

namespace {

// The family config.json's model_type names (and its architectures, where given, agree).
const FamilyTraits& config_family(const json& c, const std::string& path) {
  if (!c.is_object()) throw UnsupportedInput(path + ": not a JSON object");
  if (!c.contains("model_type") || !c["model_type"].is_string())
    throw UnsupportedInput(path + ": no \"model_type\"; ptrain implements " + family_list());
  const std::string model_type = c["model_type"].get<std::string>();
  const auto family = family_named(model_type);
  if (!family)
    throw UnsupportedInput(path + ": model_type \"" + model_type + "\" is not a family ptrain implements (" +
                           family_list() + "); see docs/models.md");
  const FamilyTraits& f = traits(*family);
  // The causal LM's class, or the base model's a base-model save names (transformers'
  // AutoModelForCausalLM builds the causal LM from model_type either way; HfCheckpoint reads
  // such a save's names as the body's, and a head it lacks is missing unless tied).
  if (c.contains("architectures") && !c["architectures"].is_null() &&
      c["architectures"] != json::array({f.architecture}) && c["architectures"] != json::array({f.base_model}))
    throw UnsupportedInput(path + ": architectures " + c["architectures"].dump() + " is not [\"" + f.architecture +
                           "\"] (nor [\"" + f.base_model + "\"], a save of its body): ptrain trains the causal " +
                           "language model of family " + f.name);
  return f;
}

// Every key transformers reads is read here, read without effect, or neutral at its value; the
// first other one is refused. Keys transformers does not read are ignored (hf_config_ignored_keys).
void check_config_json_keys(const json& c, const FamilyTraits& f, const std::string& dir, const std::string& path) {
  for (auto it = c.begin(); it != c.end(); ++it) {
    const std::string& k = it.key();
    const ConfigKey* rule = config_key(k, f.family);
    if (!rule || rule->use == KeyUse::no_effect) continue;
    if (k == "quantization_config") {  // bitsandbytes NF4 is read; anything else is refused by name
      read_hf_storage(dir);
      continue;
    }
    if (rule->use == KeyUse::refused)
      throw UnsupportedInput(path + ": key \"" + k + "\" (= " + it.value().dump() + "): " + rule->why);
    if (rule->use == KeyUse::neutral && !neutral(k, it.value()))
      throw UnsupportedInput(path + ": key \"" + k + "\" (= " + it.value().dump() + ") is read by transformers' " +
                             f.architecture + " and changes the network at this value: " + refusal_hint(k) +
                             ". See docs/models.md for what each family supports");
    if (rule->use == KeyUse::read && it.value().is_null() && !nullable(f, k))
      throw UnsupportedInput(path + ": \"" + k + "\" is null, which transformers' " + f.architecture +
                             " refuses too: give its value or remove the key (where config.json omits it, the "
                             "family's default applies)");
  }
}

// The shape config.json's (checked) keys give, with the family's defaults where it omits them.
LlamaShape config_shape(const json& c, const FamilyTraits& f, const std::string& path) {
  auto need = [&](const char* key) -> const json& {
    if (!c.contains(key) || c[key].is_null()) throw UnsupportedInput(path + ": missing \"" + key + "\"");
    return c[key];
  };
  // A key's value, or transformers' default for the family where config.json omits it (a null
  // reaches here only for a nullable key: that is `derived`, what transformers derives for it).
  auto value_or = [&](const char* key, auto absent, decltype(absent) derived = {}) -> decltype(absent) {
    if (!c.contains(key)) return absent;
    if (c[key].is_null()) return derived;
    if constexpr (std::is_same_v<decltype(absent), int64_t>)
      return json_integer(c[key], path + ": " + key);
    else
      return c[key].template get<decltype(absent)>();
  };
  LlamaShape s;
  s.family = f.family;
  s.dim = json_integer(need("hidden_size"), path + ": hidden_size");
  s.n_layers = json_integer(need("num_hidden_layers"), path + ": num_hidden_layers");
  s.n_heads = json_integer(need("num_attention_heads"), path + ": num_attention_heads");
  s.n_kv_heads = value_or("num_key_value_heads", f.default_kv_heads ? f.default_kv_heads : s.n_heads, s.n_heads);
  const int64_t width_per_head = s.n_heads ? s.dim / s.n_heads : int64_t{0};
  s.head_dim = value_or("head_dim", f.default_head_dim ? f.default_head_dim : width_per_head, width_per_head);
  if (f.heads_divide_width && s.n_heads > 0 && s.dim % s.n_heads != 0)
    throw UnsupportedInput(path + ": hidden_size " + std::to_string(s.dim) + " is not a multiple of " +
                           "num_attention_heads " + std::to_string(s.n_heads) + ", which transformers' " +
                           f.architecture + " refuses (head_dim notwithstanding)");
  s.ffn_dim = json_integer(need("intermediate_size"), path + ": intermediate_size");
  s.vocab_size = json_integer(need("vocab_size"), path + ": vocab_size");
  s.max_seq_len = value_or("max_position_embeddings", f.default_max_positions);
  s.norm_eps = value_or("rms_norm_eps", 1e-6);
  s.rope_theta = 10000.0;  // transformers' default_theta
  s.tie_embeddings = value_or("tie_word_embeddings", false);
  s.attention_bias = config_key("attention_bias", s.family) && value_or("attention_bias", false);
  s.mlp_bias = config_key("mlp_bias", s.family) && value_or("mlp_bias", false);
  s.padding_idx = read_padding_idx(c, s.vocab_size, path);
  read_rope(c, s, path);
  if (c.value("hidden_act", std::string("silu")) != "silu")
    throw UnsupportedInput(path + ": hidden_act \"" + c["hidden_act"].get<std::string>() +
                           "\": ptrain's MLP is SwiGLU (\"silu\")");
  if (value_or("attention_dropout", 0.0) != 0.0)
    throw UnsupportedInput(path + ": attention_dropout " + c["attention_dropout"].dump() +
                           ": attention dropout is not implemented (it must be 0)");
  if (f.family == Family::mistral) read_mistral_window(c, s, path);
  if (f.family == Family::qwen2 || f.family == Family::qwen3) read_qwen_window(c, s, path);
  read_unused_layer_types(c, s, path);
  return s;
}

}  // namespace

namespace {
// Whether DIR's checkpoint holds lm_head.weight and model.embed_tokens.weight with different
// values, in one dtype: transformers 5.23's from_pretrained then leaves them untied whatever
// tie_word_embeddings says (it warns). Where the two are stored in different dtypes, whether
// they are equal depends on the dtype transformers loads them in: not decided here
// (verify_hf_tensors compares them in float32 and refuses a difference).
bool head_stored_untied(const std::string& dir);
}  // namespace

LlamaShape read_hf_config(const std::string& dir) {
  if (!fs::is_regular_file(fs::path(dir) / "config.json"))
    throw RuntimeError("no config.json in '" + dir + "' (expected a Hugging Face model directory: " + family_list() +
                       ")");
  const std::string path = hf_config_file(dir);
  LlamaShape shape = hf_config_shape(read_json_file(path), path, dir);
  if (shape.tie_embeddings && head_stored_untied(dir)) shape.tie_embeddings = false;
  return shape;
}

std::string hf_untied_note(const std::string& dir, bool tie_embeddings) {
  if (tie_embeddings) return "";
  const std::string path = hf_config_file(dir);
  if (!hf_config_shape(read_json_file(path), path, dir).tie_embeddings) return "";
  return dir + ": lm_head.weight differs from model.embed_tokens.weight although " + path +
         " ties them (tie_word_embeddings): read untied, as transformers loads it (it warns; set "
         "tie_word_embeddings to false there to say so)";
}

LlamaShape hf_config_shape(const json& c, const std::string& path, const std::string& dir) {
  const FamilyTraits& f = config_family(c, path);
  check_config_json_keys(c, f, dir, path);
  try {
    return config_shape(c, f, path);
  } catch (const json::exception& e) {
    throw UnsupportedInput(path + ": unexpected value: " + e.what());
  }
}

void write_hf_config(const std::string& dir, const LlamaShape& s) {
  const FamilyTraits& f = traits(s.family);
  json c = {
      {"architectures", {f.architecture}},
      {"model_type", f.name},
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
      {"attention_dropout", 0.0},
      {"torch_dtype", "float32"},
  };
  // The family's own keys, where its code reads them.
  auto reads = [&](const char* key) { return config_key(key, s.family) != nullptr; };
  if (reads("attention_bias")) c["attention_bias"] = s.attention_bias;
  if (reads("mlp_bias")) c["mlp_bias"] = s.mlp_bias;
  if (reads("use_sliding_window")) c["use_sliding_window"] = false;
  if (s.family == Family::mistral || reads("use_sliding_window"))
    c["sliding_window"] = s.sliding_window > 0 ? json(s.sliding_window) : json(nullptr);
  if (s.padding_idx >= 0) c["pad_token_id"] = s.padding_idx;
  const RopeScaling& r = s.rope_scaling;
  c["rope_scaling"] = nullptr;
  if (r.factor > 0) {
    c["rope_scaling"] = {{"rope_type", r.type_name()}, {"factor", r.factor}};
    if (r.type == RopeType::llama3)
      c["rope_scaling"].update({{"low_freq_factor", r.low_freq_factor},
                                {"high_freq_factor", r.high_freq_factor},
                                {"original_max_position_embeddings", r.original_max_seq_len}});
    if (r.type == RopeType::yarn)  // the attention factor as ptrain resolved it, so nothing is derived again
      c["rope_scaling"].update({{"original_max_position_embeddings", r.original_max_seq_len},
                                {"beta_fast", r.beta_fast},
                                {"beta_slow", r.beta_slow},
                                {"truncate", r.truncate},
                                {"attention_factor", r.attention_factor}});
  }
  write_file_atomic((fs::path(dir) / "config.json").string(), c.dump(2) + "\n");
}

namespace {

// The weight file transformers' from_pretrained loads from `dir`: the one config.json names in
// transformers_weights (a .safetensors file or a .safetensors.index.json inside the directory;
// anything else refused, as transformers refuses it), else model.safetensors, else
// model.safetensors.index.json — in that order. Whether it is an index.
std::pair<fs::path, bool> weight_file(const std::string& dir) {
  const fs::path config = hf_config_file(dir);
  if (fs::is_regular_file(config)) {
    const json c = read_json_file(config.string());
    if (const auto it = c.find("transformers_weights"); it != c.end() && !it->is_null()) {
      const std::string key = config.string() + ": transformers_weights = " + it->dump();
      if (!it->is_string())
        throw UnsupportedInput(key + ": transformers reads a file name there (or null), and fails on this");
      const std::string name = it->get<std::string>();
      const bool index = name.ends_with(".safetensors.index.json");
      if (!index && !name.ends_with(".safetensors"))
        throw UnsupportedInput(key + ": transformers loads the weight file named there, and ptrain reads " +
                               "safetensors files and their indexes only (*.safetensors, *.safetensors.index.json)");
      const fs::path rel = fs::path(name).lexically_normal();
      if (rel.is_absolute() || rel.empty() || *rel.begin() == "..")
        throw UnsupportedInput(key + ": not a file inside the model directory (transformers refuses it too)");
      if (!fs::is_regular_file(fs::path(dir) / rel))
        throw RuntimeError(key + ": the weight file named there is missing");
      return {fs::path(dir) / rel, index};
    }
  }
  for (const auto& [name, index] : {std::pair{"model.safetensors", false},
                                    {"model.safetensors.index.json", true},
                                    {"pytorch_model.bin", false},
                                    {"pytorch_model.bin.index.json", true}})
    if (fs::is_regular_file(fs::path(dir) / name)) return {fs::path(dir) / name, index};
  return {};
}

std::shared_ptr<WeightFile> open_weight_file(const fs::path& p) {
  if (p.extension() == ".bin") return std::make_shared<TorchBinFile>(p.string());
  return std::make_shared<SafetensorsFile>(p.string());
}

}  // namespace

namespace {
// Whether `name` has the form of a parameter of these families' causal LMs: the head, or the
// base model's (embedding, final norm, blocks) under its prefix "model.".
bool causal_lm_form(const std::string& name) {
  return name == "lm_head.weight" || name.starts_with("model.embed_tokens.") || name.starts_with("model.norm.") ||
         name.starts_with("model.layers.");
}

// The name transformers 5.23 loads a stored tensor as into the family's causal LM: it strips one
// base-model prefix where that names a parameter ("model.model.x", "model.lm_head.weight" — its
// pattern "^model." lets any character stand for the dot), else adds one where that does (a
// base model's save: "embed_tokens.weight", "layers.0...", "norm.weight", as LlamaModel or
// Qwen3Model saves them and Qwen3-Embedding is released).
std::string causal_lm_name(const std::string& stored) {
  if (stored.size() > 6 && stored.starts_with("model") && causal_lm_form(stored.substr(6))) return stored.substr(6);
  if (causal_lm_form("model." + stored)) return "model." + stored;
  return stored;
}
}  // namespace

HfCheckpoint::HfCheckpoint(const std::string& dir, bool tied_embeddings) : dir_(dir) {
  const auto [weights, is_index] = weight_file(dir);
  const fs::path index = is_index ? weights : fs::path();
  const fs::path single = is_index ? fs::path() : weights;
  auto open = [&](const std::string& file) {
    auto it = files_.find(file);
    if (it != files_.end()) return it->second;
    const fs::path p = fs::path(dir) / file;
    if (fs::path(file).has_parent_path() || !fs::is_regular_file(p))
      throw RuntimeError("'" + dir + "': weight file '" + file + "' is missing (the shard index names it)");
    return files_[file] = open_weight_file(p);
  };
  if (!index.empty() && fs::is_regular_file(index)) {
    json j = read_json_file(index.string());
    if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
      throw RuntimeError(index.string() + ": missing \"weight_map\"");
    for (auto it = j["weight_map"].begin(); it != j["weight_map"].end(); ++it) {
      if (!it->is_string())
        throw RuntimeError(index.string() + ": weight_map value for '" + it.key() + "' is not a file name");
      auto file = open(it->get<std::string>());
      if (!file->contains(it.key()))
        throw RuntimeError(index.string() + " maps '" + it.key() + "' to " + it->get<std::string>() +
                           ", which lacks it");
      where_[it.key()] = file;
    }
    // A tensor a shard holds but the index does not map would be silently left out.
    for (const auto& [name, file] : files_)
      for (const auto& e : file->entries()) {
        auto w = where_.find(e.name);
        if (w == where_.end() || w->second != file)
          throw RuntimeError(index.string() + ": shard " + name + " holds tensor '" + e.name + "', which the index " +
                             (w == where_.end() ? "does not list" : "maps to another file"));
      }
  } else if (!single.empty()) {
    auto file = files_[single.lexically_relative(dir).string()] = open_weight_file(single);
    for (const auto& e : file->entries()) where_[e.name] = file;
  } else {
    std::string others;
    for (const auto& e : fs::directory_iterator(dir)) {
      const std::string ext = e.path().extension().string();
      if (ext == ".bin" || ext == ".pt" || ext == ".pth" || ext == ".gguf") others = e.path().filename().string();
    }
    throw RuntimeError("'" + dir +
                       "' has neither model.safetensors nor model.safetensors.index.json nor pytorch_model.bin nor "
                       "pytorch_model.bin.index.json, the weight files transformers loads" +
                       (others.empty() ? std::string() : " (found " + others + ")"));
  }
  // The stored names as transformers loads them; two stored tensors under one name are refused.
  std::map<std::string, std::shared_ptr<WeightFile>> renamed;
  for (const auto& [name, file] : where_) {
    const std::string as = causal_lm_name(name);
    if (!renamed.emplace(as, file).second)
      throw UnsupportedInput("'" + dir + "' holds both '" + stored_name(as) + "' and '" + name +
                             "', which transformers both loads as '" + as + "' (keep one)");
    if (as != name) stored_[as] = name;
  }
  where_ = std::move(renamed);
  // Tied, with the head stored and the embedding not: transformers ties the pair the other way.
  const std::string embedding = "model.embed_tokens.weight", head = "lm_head.weight";
  if (tied_embeddings && !where_.count(embedding) && where_.count(head)) {
    where_[embedding] = where_[head];
    stored_[embedding] = stored_name(head);
  }
}

namespace {
bool head_stored_untied(const std::string& dir) {
  if (weight_file(dir).first.empty()) return false;  // no weights: verify_hf_tensors names that
  const HfCheckpoint ckpt(dir, /*tied_embeddings=*/true);
  const std::string embedding = "model.embed_tokens.weight", head = "lm_head.weight";
  const auto names = ckpt.names();
  const auto has = [&](const std::string& n) { return std::find(names.begin(), names.end(), n) != names.end(); };
  if (!has(embedding) || !has(head) || ckpt.stored_name(embedding) == ckpt.stored_name(head)) return false;
  const at::Tensor e = ckpt.tensor(embedding), h = ckpt.tensor(head);
  return e.sizes() == h.sizes() && e.scalar_type() == h.scalar_type() && !at::equal(e, h);
}
}  // namespace

std::string HfCheckpoint::stored_name(const std::string& name) const {
  const auto it = stored_.find(name);
  return it == stored_.end() ? name : it->second;
}

std::string HfCheckpoint::renamed_note() const {
  if (stored_.empty()) return "";
  const auto& [name, stored] = *stored_.begin();
  return dir_ + ": " + std::to_string(stored_.size()) + " tensor(s) read under the names transformers loads them " +
         "as into the causal LM (e.g. '" + stored + "' as '" + name + "')";
}

at::Tensor HfCheckpoint::tensor(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw RuntimeError("HF checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  return it->second->tensor(stored_name(name));
}

const SafetensorsEntry& HfCheckpoint::entry(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw RuntimeError("HF checkpoint '" + dir_ + "' has no tensor '" + name + "'");
  return it->second->entry(stored_name(name));
}

std::vector<std::string> HfCheckpoint::names() const {
  std::vector<std::string> out;
  for (const auto& [name, file] : where_) out.push_back(name);
  return out;
}

namespace {

// The tensors a checkpoint of this shape and storage must hold: plain ones by shape, bitsandbytes
// NF4 data per projection, and redundant copies accepted when equal to what they duplicate.
struct ExpectedTensors {
  std::map<std::string, std::vector<int64_t>> plain, redundant;
  std::map<std::string, StoredTensor> quantized;
  std::vector<std::pair<std::string, std::vector<int64_t>>> projections;  // stored as NF4

  ExpectedTensors(const LlamaShape& shape, const HfStorage& storage) {
    for (const auto& unit : llama_units(shape, 0.0))
      for (const auto& slot : unit.slots) plain[slot.name] = slot.shape;
    if (storage.nf4)
      for (const auto& unit : llama_units(shape, 0.0))
        if (unit.kind == UnitKind::block)
          for (const auto& group : block_matrix_groups(unit))
            for (const auto& slot : group) {
              plain.erase(slot.name);
              projections.emplace_back(slot.name, slot.shape);
              quantized.merge(bnb_nf4_tensors(slot.name, slot.numel, storage.double_quant));
            }
    if (shape.tie_embeddings) redundant["lm_head.weight"] = {shape.vocab_size, shape.dim};
    for (int64_t l = 0; l < shape.n_layers; ++l)
      redundant["model.layers." + std::to_string(l) + ".self_attn.rotary_emb.inv_freq"] = {shape.head_dim / 2};
  }
};

// What is wrong with one stored tensor ("" where nothing is).
std::string stored_tensor_problem(const std::string& name, const SafetensorsEntry& e, const ExpectedTensors& want,
                                  const LlamaShape& shape, const HfStorage& storage) {
  if (auto q = want.quantized.find(name); q != want.quantized.end()) {
    const bool any_length = q->second.shape == std::vector<int64_t>{-1};
    if (e.dtype == q->second.dtype && (any_length ? e.shape.size() == 1 : e.shape == q->second.shape)) return "";
    return "tensor '" + name + "' is " + e.dtype + " " + c10::str(c10::IntArrayRef(e.shape)) + "; bitsandbytes NF4 (" +
           (storage.double_quant ? "" : "no ") + "double quantization, as config.json says) stores it as " +
           q->second.dtype + " " + (any_length ? std::string("[bytes]") : c10::str(c10::IntArrayRef(q->second.shape)));
  }
  auto plain = want.plain.find(name);
  auto redundant = want.redundant.find(name);
  if (plain == want.plain.end() && redundant == want.redundant.end()) {
    if (name.find(".quant_state.bitsandbytes__") != std::string::npos || name.ends_with(".absmax") ||
        name.ends_with(".SCB"))
      return "tensor '" + name + "' is quantization data " +
             (storage.nf4 ? "of a kind other than NF4 (FP4? 8-bit?), or for a module ptrain keeps "
                            "unquantized (the embedding, the head, a norm)"
                          : "but config.json has no quantization_config describing it");
    return "tensor '" + name + "' is not part of a " + traits(shape.family).name +
           " model of this config (config.json describes no such tensor; ptrain would leave it unused)";
  }
  const auto& dims = plain != want.plain.end() ? plain->second : redundant->second;
  if (e.shape != dims)
    return "tensor '" + name + "' has shape " + c10::str(c10::IntArrayRef(e.shape)) + ", config.json gives " +
           c10::str(c10::IntArrayRef(dims));
  if (e.dtype != "F32" && e.dtype != "BF16" && e.dtype != "F16")
    return "tensor '" + name + "' is stored as " + e.dtype +
           (storage.nf4 ? " (ptrain keeps it unquantized: F32, BF16 or F16)"
                        : " (ptrain loads F32, BF16 or F16 weights, or a bitsandbytes NF4 checkpoint "
                          "whose config.json says so)");
  return "";
}

// The tensors the checkpoint lacks.
void missing_problems(const ExpectedTensors& want, const std::set<std::string>& present, const LlamaShape& shape,
                      const HfStorage& storage, std::vector<std::string>& problems) {
  for (const auto& [name, stored] : want.quantized)
    if (!present.count(name))
      problems.push_back("tensor '" + name + "' is missing (bitsandbytes NF4 stores it beside every projection" +
                         (storage.double_quant ? ", with double quantization" : "") +
                         "; a projection stored unquantized, e.g. by llm_int8_skip_modules, is not supported)");
  for (const auto& [name, dims] : want.plain)
    if (!present.count(name))
      problems.push_back("tensor '" + name + "' is missing (a " + traits(shape.family).name +
                         " model of this config needs it)");
}

// Values: the NF4 data readable, a redundant head equal to the embedding it duplicates, stored
// RoPE frequencies equal to config.json's.
void value_problems(const HfCheckpoint& ckpt, const ExpectedTensors& want, const std::set<std::string>& present,
                    const LlamaShape& shape, const HfStorage& storage, std::vector<std::string>& problems) {
  for (const auto& [name, dims] : want.projections) {
    try {
      read_bnb_nf4(ckpt, name, dims, storage.double_quant);
    } catch (const UnsupportedInput& e) {
      problems.push_back(e.what());
    }
  }
  if (!problems.empty()) return;
  // a tied pair in one dtype compares in place (read_hf_config has read an unequal one untied); in
  // two dtypes, in float32
  const auto tied_pair_equal = [&] {
    const at::Tensor h = ckpt.tensor("lm_head.weight"), e = ckpt.tensor("model.embed_tokens.weight");
    return h.scalar_type() == e.scalar_type() ? at::equal(h, e) : at::equal(h.to(at::kFloat), e.to(at::kFloat));
  };
  if (shape.tie_embeddings && present.count("lm_head.weight") && !tied_pair_equal())
    problems.push_back("tensor 'lm_head.weight' (" + ckpt.entry("lm_head.weight").dtype +
                       ") differs from model.embed_tokens.weight (" + ckpt.entry("model.embed_tokens.weight").dtype +
                       ") although tie_word_embeddings is true: stored in two dtypes, whether transformers ties them "
                       "depends on the dtype it loads them in (store both in one dtype, or set tie_word_embeddings "
                       "to false in config.json to train them untied)");
  const at::Tensor inv_freq = rope_inv_freq(shape);
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    const std::string name = "model.layers." + std::to_string(l) + ".self_attn.rotary_emb.inv_freq";
    if (present.count(name) && !at::allclose(ckpt.tensor(name).to(at::kFloat), inv_freq, 1e-5, 0.0))
      problems.push_back("tensor '" + name + "' holds RoPE frequencies other than config.json's (rope_theta " +
                         std::to_string(shape.rope_theta) + ")");
  }
}

}  // namespace

void verify_hf_tensors(const HfCheckpoint& ckpt, const LlamaShape& shape, const HfStorage& storage,
                       bool compare_values) {
  const ExpectedTensors want(shape, storage);
  std::vector<std::string> problems;
  std::set<std::string> present;
  for (const auto& name : ckpt.names()) {
    present.insert(name);
    if (std::string p = stored_tensor_problem(name, ckpt.entry(name), want, shape, storage); !p.empty())
      problems.push_back(ckpt.stored_name(name) == name ? p : p + " (stored as '" + ckpt.stored_name(name) + "')");
  }
  missing_problems(want, present, shape, storage, problems);
  if (problems.empty() && compare_values) value_problems(ckpt, want, present, shape, storage, problems);
  if (problems.empty()) return;
  std::string msg = "the weights do not match the model config.json describes:";
  constexpr size_t kShown = 12;
  for (size_t i = 0; i < std::min(problems.size(), kShown); ++i) msg += "\n  " + problems[i];
  if (problems.size() > kShown) msg += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
  throw UnsupportedInput(msg);
}

}  // namespace ptrain
