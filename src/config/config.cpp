// TOML -> Config: the key table (kKeys), parsing with source lines, overrides, and
// resolution of the model shape from preset / hf_path.
#include "config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <variant>

#include "checkpoint/hf.h"
#include "parallel/precision.h"

namespace ptrain {

namespace fs = std::filesystem;

std::string Config::output_dir() const {
  return run.output_dir.empty() ? "runs/" + run.name : run.output_dir;
}

std::string Config::checkpoint_dir() const {
  return checkpoint.dir.empty() ? output_dir() + "/checkpoints" : checkpoint.dir;
}

Config::Origin Config::origin(const std::string& key) const {
  auto it = origins.find(key);
  if (it != origins.end()) return it->second;
  return Origin{source_file, 0};
}

namespace {

using Value = std::variant<int64_t, double, bool, std::string, std::vector<double>,
                           std::vector<std::string>>;
enum class Type { Int, Float, Bool, String, FloatList, StringList };

const char* type_name(Type t) {
  switch (t) {
    case Type::Int: return "an integer";
    case Type::Float: return "a number";
    case Type::Bool: return "true or false";
    case Type::String: return "a string";
    case Type::FloatList: return "an array of numbers";
    case Type::StringList: return "an array of strings";
  }
  return "?";
}

template <class T> constexpr Type type_of();
template <> constexpr Type type_of<int64_t>() { return Type::Int; }
template <> constexpr Type type_of<double>() { return Type::Float; }
template <> constexpr Type type_of<bool>() { return Type::Bool; }
template <> constexpr Type type_of<std::string>() { return Type::String; }
template <> constexpr Type type_of<std::vector<double>>() { return Type::FloatList; }
template <> constexpr Type type_of<std::vector<std::string>>() { return Type::StringList; }

struct Key {
  std::string section;
  std::string name;
  Type type;
  std::function<void(Config&, const Value&)> set;
  std::function<Value(const Config&)> get;
  bool model_dim = false;  // part of the model shape (taken from hf_path's config.json there)
  std::string full() const { return section + "." + name; }
};

// One entry per config key. Defaults live in the Config struct initialisers (config.h).
#define PTRAIN_KEY(SEC, NAME, MEMBER)                                                    \
  Key{SEC, NAME, type_of<std::decay_t<decltype(Config{}.MEMBER)>>(),                      \
      [](Config& c, const Value& v) { c.MEMBER = std::get<std::decay_t<decltype(c.MEMBER)>>(v); }, \
      [](const Config& c) { return Value(c.MEMBER); }}
#define PTRAIN_DIM(NAME, MEMBER)                 \
  [] {                                           \
    Key k = PTRAIN_KEY("model", NAME, MEMBER);   \
    k.model_dim = true;                          \
    return k;                                    \
  }()

const std::vector<Key>& keys() {
  static const std::vector<Key> kKeys = {
      PTRAIN_KEY("run", "name", run.name),
      PTRAIN_KEY("run", "output_dir", run.output_dir),
      PTRAIN_KEY("run", "seed", run.seed),
      PTRAIN_KEY("model", "preset", model.preset),
      PTRAIN_KEY("model", "hf_path", model.hf_path),
      PTRAIN_KEY("model", "init_std", model.init_std),
      PTRAIN_DIM("dim", model.shape.dim),
      PTRAIN_DIM("n_layers", model.shape.n_layers),
      PTRAIN_DIM("n_heads", model.shape.n_heads),
      PTRAIN_DIM("n_kv_heads", model.shape.n_kv_heads),
      PTRAIN_DIM("head_dim", model.shape.head_dim),
      PTRAIN_DIM("ffn_dim", model.shape.ffn_dim),
      PTRAIN_DIM("vocab_size", model.shape.vocab_size),
      PTRAIN_DIM("max_seq_len", model.shape.max_seq_len),
      PTRAIN_DIM("rope_theta", model.shape.rope_theta),
      PTRAIN_DIM("norm_eps", model.shape.norm_eps),
      PTRAIN_DIM("tie_embeddings", model.shape.tie_embeddings),
      PTRAIN_DIM("rope_scaling_factor", model.shape.rope_scaling.factor),
      PTRAIN_DIM("rope_low_freq_factor", model.shape.rope_scaling.low_freq_factor),
      PTRAIN_DIM("rope_high_freq_factor", model.shape.rope_scaling.high_freq_factor),
      PTRAIN_DIM("rope_original_max_seq_len", model.shape.rope_scaling.original_max_seq_len),
      PTRAIN_KEY("data", "path", data.path),
      PTRAIN_KEY("data", "format", data.format),
      PTRAIN_KEY("data", "seq_len", data.seq_len),
      PTRAIN_KEY("data", "micro_batch_size", data.micro_batch_size),
      PTRAIN_KEY("data", "val_fraction", data.val_fraction),
      PTRAIN_KEY("training", "steps", training.steps),
      PTRAIN_KEY("training", "grad_accum_steps", training.grad_accum_steps),
      PTRAIN_KEY("training", "max_grad_norm", training.max_grad_norm),
      PTRAIN_KEY("training", "log_every", training.log_every),
      PTRAIN_KEY("training", "eval_every", training.eval_every),
      PTRAIN_KEY("training", "eval_batches", training.eval_batches),
      PTRAIN_KEY("training", "device", training.device),
      PTRAIN_KEY("training", "threads", training.threads),
      PTRAIN_KEY("optimizer", "name", optimizer.name),
      PTRAIN_KEY("optimizer", "lr", optimizer.lr),
      PTRAIN_KEY("optimizer", "betas", optimizer.betas),
      PTRAIN_KEY("optimizer", "eps", optimizer.eps),
      PTRAIN_KEY("optimizer", "weight_decay", optimizer.weight_decay),
      PTRAIN_KEY("optimizer", "in_backward", optimizer.in_backward),
      PTRAIN_KEY("lr_schedule", "warmup_steps", lr_schedule.warmup_steps),
      PTRAIN_KEY("lr_schedule", "decay", lr_schedule.decay),
      PTRAIN_KEY("lr_schedule", "min_lr_ratio", lr_schedule.min_lr_ratio),
      PTRAIN_KEY("precision", "mode", precision.mode),
      PTRAIN_KEY("precision", "param_dtype", precision.param_dtype),
      PTRAIN_KEY("precision", "reduce_dtype", precision.reduce_dtype),
      PTRAIN_KEY("precision", "logits_dtype", precision.logits_dtype),
      PTRAIN_KEY("precision", "allow_bf16_logits", precision.allow_bf16_logits),
      PTRAIN_KEY("precision", "rope_dtype", precision.rope_dtype),
      PTRAIN_KEY("precision", "stochastic_rounding", precision.stochastic_rounding),
      PTRAIN_KEY("parallel", "backend", parallel.backend),
      PTRAIN_KEY("parallel", "reshard_after_forward", parallel.reshard_after_forward),
      PTRAIN_KEY("parallel", "prefetch", parallel.prefetch),
      PTRAIN_KEY("parallel", "timeout_s", parallel.timeout_s),
      PTRAIN_KEY("memory", "activation_checkpointing", memory.activation_checkpointing),
      PTRAIN_KEY("memory", "activation_offloading", memory.activation_offloading),
      PTRAIN_KEY("memory", "loss_chunk_tokens", memory.loss_chunk_tokens),
      PTRAIN_KEY("checkpoint", "dir", checkpoint.dir),
      PTRAIN_KEY("checkpoint", "every_steps", checkpoint.every_steps),
      PTRAIN_KEY("checkpoint", "keep", checkpoint.keep),
      PTRAIN_KEY("checkpoint", "resume", checkpoint.resume),
      PTRAIN_KEY("checkpoint", "save_final", checkpoint.save_final),
      PTRAIN_KEY("lora", "enabled", lora.enabled),
      PTRAIN_KEY("lora", "rank", lora.rank),
      PTRAIN_KEY("lora", "alpha", lora.alpha),
      PTRAIN_KEY("lora", "dropout", lora.dropout),
      PTRAIN_KEY("lora", "targets", lora.targets),
      PTRAIN_KEY("lora", "adapter_path", lora.adapter_path),
      PTRAIN_KEY("quant", "base", quant.base),
      PTRAIN_KEY("quant", "double_quant", quant.double_quant),
  };
  return kKeys;
}
#undef PTRAIN_KEY
#undef PTRAIN_DIM

const Key* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : keys())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<size_t> row(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    size_t diag = row[0];
    row[0] = i;
    for (size_t j = 1; j <= b.size(); ++j) {
      size_t up = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diag + (a[i - 1] != b[j - 1])});
      diag = up;
    }
  }
  return row[b.size()];
}

// "did you mean ...": the closest known name within a third of its length, or the same key
// name in another section.
std::string suggest(const std::string& section, const std::string& name) {
  std::string best;
  size_t best_d = std::max<size_t>(2, name.size() / 3) + 1;
  for (const auto& k : keys()) {
    if (k.section == section) {
      size_t d = edit_distance(name, k.name);
      if (d < best_d) best_d = d, best = k.full();
    }
  }
  if (best.empty())
    for (const auto& k : keys())
      if (k.name == name) return "; did you mean " + k.full() + "?";
  return best.empty() ? "" : "; did you mean " + best + "?";
}

std::string suggest_section(const std::string& section) {
  std::set<std::string> sections;
  for (const auto& k : keys()) sections.insert(k.section);
  std::string best;
  size_t best_d = std::max<size_t>(2, section.size() / 3) + 1;
  for (const auto& s : sections) {
    size_t d = edit_distance(section, s);
    if (d < best_d) best_d = d, best = s;
  }
  return best.empty() ? "" : "; did you mean [" + best + "]?";
}

// Converts a TOML node to the key's type; "" on success, else the reason.
std::string convert(const toml::node& node, Type type, Value& out) {
  switch (type) {
    case Type::Int:
      if (!node.is_integer()) break;
      out = node.value<int64_t>().value();
      return "";
    case Type::Float:
      if (!node.is_number()) break;
      out = node.value<double>().value();
      return "";
    case Type::Bool:
      if (!node.is_boolean()) break;
      out = node.value<bool>().value();
      return "";
    case Type::String:
      if (!node.is_string()) break;
      out = node.value<std::string>().value();
      return "";
    case Type::FloatList: {
      const auto* arr = node.as_array();
      if (!arr) break;
      std::vector<double> v;
      for (const auto& e : *arr) {
        if (!e.is_number()) return std::string("expected ") + type_name(type);
        v.push_back(e.value<double>().value());
      }
      out = v;
      return "";
    }
    case Type::StringList: {
      const auto* arr = node.as_array();
      if (!arr) break;
      std::vector<std::string> v;
      for (const auto& e : *arr) {
        if (!e.is_string()) return std::string("expected ") + type_name(type);
        v.push_back(e.value<std::string>().value());
      }
      out = v;
      return "";
    }
  }
  std::ostringstream got;
  got << node.type();
  return std::string("expected ") + type_name(type) + ", got " + got.str();
}

struct Assignment {
  const Key* key;
  Value value;
  Config::Origin origin;
};

// Collects typed assignments from a parsed TOML table; problems for unknown/mistyped keys.
void collect(const toml::table& root, const std::string& file, std::vector<Assignment>& out,
             std::vector<ConfigProblem>& problems) {
  for (auto&& [sec_key, sec_node] : root) {
    const std::string section(sec_key.str());
    const int sec_line = static_cast<int>(sec_key.source().begin.line);
    const auto* table = sec_node.as_table();
    if (!table) {
      problems.push_back({file, sec_line, section, "key outside any [section]" + suggest("", section)});
      continue;
    }
    bool known_section = false;
    for (const auto& k : keys()) known_section |= k.section == section;
    if (!known_section) {
      problems.push_back({file, sec_line, section,
                          "unknown section [" + section + "]" + suggest_section(section)});
      continue;
    }
    for (auto&& [key, node] : *table) {
      const std::string name(key.str());
      const int line = static_cast<int>(node.source().begin.line);
      const Key* spec = find_key(section, name);
      if (!spec) {
        problems.push_back({file, line, section + "." + name,
                            "unknown key" + suggest(section, name)});
        continue;
      }
      Value v;
      std::string why = convert(node, spec->type, v);
      if (!why.empty()) {
        problems.push_back({file, line, spec->full(), why});
        continue;
      }
      out.push_back({spec, v, {file, line}});
    }
  }
}

// `section.key=value`: value parsed as TOML, or taken as a bare string when it is not TOML.
void collect_override(const std::string& text, int index, std::vector<Assignment>& out,
                      std::vector<ConfigProblem>& problems) {
  const std::string origin = "--set";
  auto eq = text.find('=');
  auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    problems.push_back({origin, index, text, "expected --set section.key=value"});
    return;
  }
  const std::string section = text.substr(0, dot);
  const std::string name = text.substr(dot + 1, eq - dot - 1);
  const std::string raw = text.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + raw);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", raw}};
  }
  toml::table wrapped{{section, toml::table{}}};
  wrapped[section].as_table()->insert_or_assign(name, *parsed.get("v"));
  std::vector<ConfigProblem> local;
  std::vector<Assignment> parsed_here;
  collect(wrapped, origin, parsed_here, local);
  for (auto& p : local) {
    p.line = index;
    problems.push_back(p);
  }
  for (auto& a : parsed_here) {
    a.origin.line = index;
    out.push_back(a);
  }
}

std::string format_value(const Value& v) {
  std::ostringstream out;
  std::visit(
      [&](const auto& x) {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          out << toml::value<std::string>(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          out << (x ? "true" : "false");
        } else if constexpr (std::is_same_v<T, double>) {
          out << toml::value<double>(x);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          out << x;
        } else {
          out << "[";
          for (size_t i = 0; i < x.size(); ++i) {
            if (i) out << ", ";
            if constexpr (std::is_same_v<T, std::vector<std::string>>)
              out << toml::value<std::string>(x[i]);
            else
              out << toml::value<double>(x[i]);
          }
          out << "]";
        }
      },
      v);
  return out.str();
}

}  // namespace

std::vector<std::string> known_keys() {
  std::vector<std::string> out;
  for (const auto& k : keys()) out.push_back(k.full());
  return out;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const Environment& env) {
  std::vector<ConfigProblem> problems;
  std::vector<Assignment> assignments;
  Config config;
  config.source_file = path;

  if (!fs::is_regular_file(path)) {
    throw ConfigError({{path, 0, "config", "no such config file; pass an existing TOML file to --config"}});
  }
  try {
    toml::table root = toml::parse_file(path);
    collect(root, path, assignments, problems);
  } catch (const toml::parse_error& e) {
    problems.push_back({path, static_cast<int>(e.source().begin.line), "toml",
                        std::string(e.description()) + " (fix the TOML syntax)"});
    throw ConfigError(std::move(problems));  // nothing else can be checked reliably
  }
  for (size_t i = 0; i < overrides.size(); ++i)
    collect_override(overrides[i], static_cast<int>(i + 1), assignments, problems);

  // Model shape: preset or hf_path first, then explicit per-dimension keys on top.
  for (const auto& a : assignments)
    if (!a.key->model_dim) {
      a.key->set(config, a.value);
      config.origins[a.key->full()] = a.origin;
    }
  if (!config.model.hf_path.empty()) {
    try {
      config.model.shape = read_hf_config(config.model.hf_path);
    } catch (const std::exception& e) {
      auto o = config.origin("model.hf_path");
      problems.push_back({o.file, o.line, "model.hf_path", e.what()});
    }
  } else if (auto shape = preset_shape(config.model.preset)) {
    config.model.shape = *shape;
  } else {
    auto o = config.origin("model.preset");
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    problems.push_back({o.file, o.line, "model.preset",
                        "unknown preset '" + config.model.preset + "'; use one of " + names +
                            " or set model.hf_path"});
  }
  // Without a shape the dimension rules would only echo the problem above.
  if (config.model.shape.dim == 0) throw ConfigError(std::move(problems));
  const bool head_dim_set = std::any_of(assignments.begin(), assignments.end(),
                                        [](const Assignment& a) { return a.key->name == "head_dim"; });
  for (const auto& a : assignments)
    if (a.key->model_dim) {
      if (!config.model.hf_path.empty()) {
        problems.push_back({a.origin.file, a.origin.line, a.key->full(),
                            "the shape comes from model.hf_path's config.json; remove this key"});
        continue;
      }
      a.key->set(config, a.value);
      config.origins[a.key->full()] = a.origin;
    }
  auto& s = config.model.shape;
  if (!head_dim_set && config.model.hf_path.empty() && s.n_heads > 0) s.head_dim = s.dim / s.n_heads;

  validate(config, env, problems);
  if (!problems.empty()) throw ConfigError(std::move(problems));
  return config;
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  std::string section;
  for (const auto& k : keys()) {
    if (k.section != section) {
      section = k.section;
      out << (out.tellp() > 0 ? "\n" : "") << "[" << section << "]\n";
    }
    const bool from_hf = k.model_dim && !config.model.hf_path.empty();
    out << (from_hf ? "# (from hf_path) " : "") << k.name << " = " << format_value(k.get(config))
        << "\n";
  }
  return out.str();
}

PrecisionPolicy precision_policy(const Config& c) {
  PrecisionPolicy p;
  p.mode = c.precision.mode;
  auto dtype = [](const std::string& name, c10::ScalarType fallback) {
    if (name == "float32") return c10::kFloat;
    if (name == "bfloat16") return c10::kBFloat16;
    return fallback;
  };
  if (p.mode != "fp32") p.logits_dtype = dtype(c.precision.logits_dtype, c10::kFloat);
  if (p.mode == "mixed") {
    p.compute_dtype = dtype(c.precision.param_dtype, c10::kBFloat16);
    p.reduce_dtype = dtype(c.precision.reduce_dtype, c10::kFloat);
  } else if (p.mode == "bf16") {
    p.master_dtype = p.compute_dtype = p.optim_dtype = c10::kBFloat16;
    p.reduce_dtype = dtype(c.precision.reduce_dtype, c10::kBFloat16);
    p.stochastic_rounding = c.precision.stochastic_rounding;
  }
  p.optim_8bit = c.optimizer.name == "adamw8bit";
  return p;
}

}  // namespace ptrain
