#include "checkpoint/peft.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <set>

#include "checkpoint/safetensors.h"
#include "checkpoint/torch_bin.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"
#include "common/regex.h"
#include "model/layout.h"
#include "model/shape.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
const std::string kPrefix = "base_model.model.";

// Keys that describe the file, the PEFT version or how the adapter was initialised: a trained
// adapter computes the same whatever they say (init_lora_weights only as true, false or
// "gaussian": the other schemes rewrite the base weights when PEFT loads the adapter).
const std::set<std::string>& descriptive_keys() {
  static const std::set<std::string> k{"inference_mode",  "peft_version",      "revision",       "auto_mapping",
                                       "megatron_config", "megatron_core",     "loftq_config",   "corda_config",
                                       "eva_config",      "kasa_config",       "lora_ga_config", "monteclora_config",
                                       "velora_config",   "qalora_group_size", "runtime_config", "task_type"};
  return k;
}

// Keys that change the network unless they hold their neutral value (null, false, {}, [], "none").
bool peft_key_neutral(const std::string& key, const json& v) {
  static const std::set<std::string> k{"rank_pattern",
                                       "alpha_pattern",
                                       "layers_to_transform",
                                       "layers_pattern",
                                       "modules_to_save",
                                       "fan_in_fan_out",
                                       "use_dora",
                                       "lora_bias",
                                       "layer_replication",
                                       "target_parameters",
                                       "exclude_modules",
                                       "trainable_token_indices",
                                       "alora_invocation_tokens",
                                       "use_qalora",
                                       "use_bdlora",
                                       "arrow_config",
                                       "ensure_weight_tying",
                                       "bias"};
  if (!k.count(key)) return false;
  if (key == "bias") return v == "none";
  if (key == "rank_pattern" || key == "alpha_pattern") return v.is_object() && v.empty();  // PEFT fails on null
  return v.is_null() || v == false || (v.is_object() && v.empty()) || (v.is_array() && v.empty());
}

std::string why_refused(const std::string& key) {
  if (key == "rank_pattern" || key == "alpha_pattern") return "per-module ranks and alphas are not implemented";
  if (key == "layers_to_transform" || key == "layers_pattern" || key == "exclude_modules")
    return "ptrain adapts the same projections in every block";
  if (key == "modules_to_save") return "fully trained extra modules are not implemented";
  if (key == "use_dora") return "DoRA is not implemented";
  if (key == "bias" || key == "lora_bias") return "trained biases are not implemented (biases stay part of the base)";
  return "ptrain does not implement it";
}

// The module names of a model of `shape` that PEFT could target, and ptrain's target for each;
// the other modules' names ("" for a module ptrain cannot adapt: the model, a block, a norm, the
// embedding, ...; a family's names it lacks included, which only makes a refusal likelier).
std::vector<std::pair<std::string, std::string>> modules_of(const LlamaShape& shape) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const char* m : {"", "model", "model.embed_tokens", "model.layers", "model.norm", "model.rotary_emb"})
    out.emplace_back(m, "");
  for (int64_t l = 0; l < shape.n_layers; ++l) {
    const std::string block = "model.layers." + std::to_string(l);
    for (const char* m : {"", ".self_attn", ".mlp", ".mlp.act_fn", ".input_layernorm", ".post_attention_layernorm",
                          ".self_attn.q_norm", ".self_attn.k_norm"})
      out.emplace_back(block + m, "");
    for (const auto& p : block_projections(shape)) out.emplace_back(block + "." + p.module, p.target);
  }
  out.emplace_back("lm_head", "output");
  return out;
}
}  // namespace

namespace {

// The keys PEFT reads that ptrain cannot reproduce are refused by name; its task type and
// weight initialisations that rewrite the base likewise.
void check_peft_keys(const json& cfg, const std::string& cfg_path) {
  if (cfg.value("peft_type", "") != "LORA")
    throw RuntimeError(cfg_path + ": peft_type is '" + cfg.value("peft_type", "") + "', ptrain reads LORA adapters");
  if (cfg.contains("task_type") && !cfg["task_type"].is_null() && cfg["task_type"] != "CAUSAL_LM")
    throw RuntimeError(cfg_path + ": task_type " + cfg["task_type"].dump() + " is not CAUSAL_LM");
  static const std::set<std::string> read{
      "peft_type",        "r", "lora_alpha", "lora_dropout", "use_rslora", "target_modules", "base_model_name_or_path",
      "init_lora_weights"};
  for (auto it = cfg.begin(); it != cfg.end(); ++it) {
    if (read.count(it.key()) || descriptive_keys().count(it.key()) || peft_key_neutral(it.key(), it.value())) continue;
    throw RuntimeError(cfg_path + ": \"" + it.key() + "\" = " + it.value().dump().substr(0, 80) + ": " +
                       why_refused(it.key()));
  }
  if (cfg.contains("init_lora_weights") && !cfg["init_lora_weights"].is_boolean() &&
      !cfg["init_lora_weights"].is_null() && cfg["init_lora_weights"] != "gaussian")
    throw RuntimeError(cfg_path + ": init_lora_weights = " + cfg["init_lora_weights"].dump().substr(0, 80) +
                       ": PEFT then rewrites the base weights when it loads the adapter (PiSSA, OLoRA, LoftQ, ...), "
                       "which ptrain does not");
}

// r, lora_alpha, lora_dropout, use_rslora, base_model_name_or_path.
void read_lora_scalars(const json& cfg, const std::string& cfg_path, PeftAdapter& a) {
  a.rank = json_integer(cfg.at("r"), cfg_path + ": r");
  if (a.rank < 1 || a.rank > (int64_t{1} << 20))
    throw RuntimeError(cfg_path + ": r = " + std::to_string(a.rank) + " must be a rank from 1 to 1048576");
  a.alpha = cfg.at("lora_alpha").get<double>();
  // lora_dropout: PEFT's default when absent; a probability in [0, 1) (PEFT fails on null).
  a.dropout = cfg.contains("lora_dropout") ? cfg["lora_dropout"].get<double>() : 0.0;
  if (!(a.dropout >= 0 && a.dropout < 1))
    throw RuntimeError(cfg_path + ": lora_dropout = " + cfg["lora_dropout"].dump() + " must be in [0, 1)");
  // use_rslora: PEFT takes any truthy value (1, "false") as true; only a boolean is read here.
  if (cfg.contains("use_rslora") && !cfg["use_rslora"].is_null() && !cfg["use_rslora"].is_boolean())
    throw RuntimeError(cfg_path + ": use_rslora = " + cfg["use_rslora"].dump().substr(0, 80) +
                       " is not true or false (PEFT reads any non-empty value as true); write a boolean");
  a.rslora = cfg.contains("use_rslora") && cfg["use_rslora"] == true;
  a.base_model = cfg.contains("base_model_name_or_path") && cfg["base_model_name_or_path"].is_string()
                     ? cfg["base_model_name_or_path"].get<std::string>()
                     : "";
}

// Whether target_modules selects `module` as PEFT selects it: a list of names (a module matches
// by itself or a dotted suffix), a regex PEFT full-matches against module names, or "all-linear"
// (every linear layer but the output; PEFT lowercases this one value).
class TargetMatcher {
 public:
  TargetMatcher(const json& t, const std::string& cfg_path) : t_(t), cfg_path_(cfg_path) {
    if (t.is_array()) {
      for (const auto& name : t)
        if (!name.is_string())
          throw RuntimeError(cfg_path + ": target_modules holds " + name.dump().substr(0, 40) + ", not a module name");
      return;
    }
    if (!t.is_string()) throw RuntimeError(cfg_path + ": target_modules must be a list of names or a regex string");
    std::string lowered = t.get<std::string>();
    std::transform(lowered.begin(), lowered.end(), lowered.begin(), [](unsigned char ch) { return std::tolower(ch); });
    all_linear_ = lowered == "all-linear";
  }
  bool matches(const std::string& module, const std::string& target) {
    if (t_.is_array()) {
      bool match = false;
      for (const auto& entry : t_) {
        const std::string n = entry.get<std::string>();
        match |= module == n || (module.size() > n.size() && module.ends_with("." + n));
      }
      return match;
    }
    if (all_linear_) return !target.empty() && target != "output";
    if (!pattern_)
      pattern_ = std::make_unique<Regex>(t_.get<std::string>(), [&](const std::string& why) {
        throw RuntimeError(cfg_path_ + ": target_modules: " + why);
      });
    // Module names are short: a real pattern needs a few hundred steps, one that backtracks
    // without end is stopped here.
    try {
      return pattern_->full_match(module, 100000);
    } catch (const RuntimeError& e) {
      throw RuntimeError(cfg_path_ + ": target_modules " + t_.dump() + ": " + e.what() +
                         " (a pattern that backtracks without end?)");
    }
  }

 private:
  const json& t_;
  const std::string& cfg_path_;
  bool all_linear_ = false;
  std::unique_ptr<Regex> pattern_;
};

// The projections target_modules adapts: each in every block (or the output), in lora_targets() order.
std::vector<std::string> read_targets(const json& t, const std::string& cfg_path, const LlamaShape& shape) {
  TargetMatcher matcher(t, cfg_path);
  std::map<std::string, std::set<int64_t>> hits;  // target -> layers it matched
  for (const auto& [module, target] : modules_of(shape)) {
    if (!matcher.matches(module, target)) continue;
    if (target.empty())
      throw RuntimeError(cfg_path + ": target_modules " + t.dump().substr(0, 80) + " matches '" + module +
                         "', which is not a projection ptrain adapts (" +
                         "q_proj, k_proj, v_proj, o_proj, gate_proj, up_proj, down_proj, lm_head)");
    hits[target].insert(module == "lm_head" ? -1 : std::stoll(module.substr(13)));
  }
  std::vector<std::string> targets;
  for (const auto& [target, layers] : hits) {
    if (target != "output" && static_cast<int64_t>(layers.size()) != shape.n_layers)
      throw RuntimeError(cfg_path + ": target_modules " + t.dump() + " adapts " + peft_module(target) + " in " +
                         std::to_string(layers.size()) + " of " + std::to_string(shape.n_layers) +
                         " blocks; ptrain adapts the same projections in every block");
    targets.push_back(target);
  }
  if (targets.empty()) throw RuntimeError(cfg_path + ": target_modules " + t.dump() + " matches no projection");
  const auto& all = lora_targets();
  auto pos = [&](const std::string& n) {
    return std::find_if(all.begin(), all.end(), [&](const LoraTarget& l) { return n == l.name; }) - all.begin();
  };
  std::sort(targets.begin(), targets.end(),
            [&](const std::string& x, const std::string& y) { return pos(x) < pos(y); });
  return targets;
}

}  // namespace

PeftAdapter read_peft_config(const std::string& dir, const LlamaShape& shape) {
  const std::string cfg_path = (fs::path(dir) / "adapter_config.json").string();
  if (!fs::is_regular_file(cfg_path)) throw RuntimeError("no PEFT adapter at '" + dir + "' (no adapter_config.json)");
  PeftAdapter a;
  try {
    json cfg = json::parse(read_text_file(cfg_path));
    if (!cfg.is_object()) throw RuntimeError(cfg_path + ": not a JSON object");
    check_peft_keys(cfg, cfg_path);
    read_lora_scalars(cfg, cfg_path, a);
    a.targets = read_targets(cfg.at("target_modules"), cfg_path, shape);
  } catch (const json::exception& e) {
    throw RuntimeError(cfg_path + " is not a valid PEFT adapter config: " + e.what());
  }
  return a;
}

PeftAdapter read_peft(const std::string& dir, const LlamaShape& shape) {
  PeftAdapter a = read_peft_config(dir, shape);
  // As PEFT loads them: adapter_model.safetensors, else adapter_model.bin (torch.save's, which PEFT
  // wrote before 0.6 and writes with safe_serialization=False).
  const fs::path st = fs::path(dir) / "adapter_model.safetensors", bin = fs::path(dir) / "adapter_model.bin";
  std::unique_ptr<WeightFile> file;
  if (!fs::is_regular_file(st) && fs::is_regular_file(bin))
    file = std::make_unique<TorchBinFile>(bin.string());
  else
    file = std::make_unique<SafetensorsFile>(st.string());
  for (const auto& e : file->entries()) {
    if (e.name.rfind(kPrefix, 0) != 0)
      throw RuntimeError(file->path() + ": tensor '" + e.name + "' does not start with '" + kPrefix + "'");
    a.tensors[e.name.substr(kPrefix.size())] = file->tensor(e.name).to(at::kFloat).clone();
  }
  return a;
}

void write_peft(const std::string& dir, const PeftAdapter& a) {
  fs::create_directories(dir);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (const auto& [name, t] : a.tensors) named.emplace_back(kPrefix + name, t.contiguous());
  write_safetensors((fs::path(dir) / "adapter_model.safetensors").string(), named, {{"format", "pt"}});
  json modules = json::array();
  for (const auto& t : a.targets) modules.push_back(peft_module(t));
  json cfg = {{"peft_type", "LORA"},
              {"task_type", "CAUSAL_LM"},
              {"r", a.rank},
              {"lora_alpha", a.alpha},
              {"lora_dropout", a.dropout},
              {"target_modules", modules},
              {"bias", "none"},
              {"fan_in_fan_out", false},
              {"inference_mode", true},
              {"init_lora_weights", true},
              {"use_rslora", a.rslora},
              {"use_dora", false},
              {"modules_to_save", nullptr},
              {"base_model_name_or_path", a.base_model.empty() ? json(nullptr) : json(a.base_model)}};
  write_file_atomic((fs::path(dir) / "adapter_config.json").string(), cfg.dump(2) + "\n");
}

}  // namespace ptrain
