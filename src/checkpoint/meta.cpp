#include "checkpoint/meta.h"

#include <optional>
#include <set>

#include "common/error.h"

namespace ptrain {

using json = nlohmann::json;

json shape_json(const LlamaShape& s) {
  return {{"dim", s.dim},
          {"n_layers", s.n_layers},
          {"n_heads", s.n_heads},
          {"n_kv_heads", s.n_kv_heads},
          {"head_dim", s.head_dim},
          {"ffn_dim", s.ffn_dim},
          {"vocab_size", s.vocab_size},
          {"max_seq_len", s.max_seq_len},
          {"rope_theta", s.rope_theta},
          {"norm_eps", s.norm_eps},
          {"tie_embeddings", s.tie_embeddings},
          {"family", traits(s.family).name},
          {"attention_bias", s.attention_bias},
          {"mlp_bias", s.mlp_bias},
          {"sliding_window", s.sliding_window},
          {"padding_idx", s.padding_idx},
          {"rope_scaling",
           {{"type", s.rope_scaling.type_name()},
            {"factor", s.rope_scaling.factor},
            {"low_freq_factor", s.rope_scaling.low_freq_factor},
            {"high_freq_factor", s.rope_scaling.high_freq_factor},
            {"original_max_seq_len", s.rope_scaling.original_max_seq_len},
            {"beta_fast", s.rope_scaling.beta_fast},
            {"beta_slow", s.rope_scaling.beta_slow},
            {"truncate", s.rope_scaling.truncate},
            {"attention_factor", s.rope_scaling.attention_factor}}}};
}

LlamaShape shape_from_json(const json& j) {
  LlamaShape s;
  s.dim = j.at("dim");
  s.n_layers = j.at("n_layers");
  s.n_heads = j.at("n_heads");
  s.n_kv_heads = j.at("n_kv_heads");
  s.head_dim = j.at("head_dim");
  s.ffn_dim = j.at("ffn_dim");
  s.vocab_size = j.at("vocab_size");
  s.max_seq_len = j.at("max_seq_len");
  s.rope_theta = j.at("rope_theta");
  s.norm_eps = j.at("norm_eps");
  s.tie_embeddings = j.at("tie_embeddings");
  // Checkpoints from before the families hold Llamas without biases.
  const std::string family = j.value("family", std::string("llama"));
  const auto f = family_named(family);
  if (!f)
    throw UnsupportedInput("checkpoint meta.json: model family \"" + family + "\" is not one ptrain implements (" +
                           family_names() + ")");
  s.family = *f;
  s.attention_bias = j.value("attention_bias", false);
  s.mlp_bias = j.value("mlp_bias", false);
  s.sliding_window = j.value("sliding_window", int64_t{0});
  s.padding_idx = j.value("padding_idx", int64_t{-1});  // checkpoints from before it: none
  // Checkpoints from before YaRN and linear scaling hold llama3 scaling or none.
  const auto& r = j.at("rope_scaling");
  RopeScaling& rope = s.rope_scaling;
  const std::string type = r.value("type", std::string("llama3"));
  const auto t = rope_type_named(type);
  if (!t)
    throw UnsupportedInput("checkpoint meta.json: RoPE scaling type \"" + type + "\" is not one ptrain implements");
  rope.type = *t;
  rope.factor = r.at("factor");
  rope.low_freq_factor = r.at("low_freq_factor");
  rope.high_freq_factor = r.at("high_freq_factor");
  rope.original_max_seq_len = r.at("original_max_seq_len");
  rope.beta_fast = r.value("beta_fast", rope.beta_fast);
  rope.beta_slow = r.value("beta_slow", rope.beta_slow);
  rope.truncate = r.value("truncate", rope.truncate);
  rope.attention_factor = r.value("attention_factor", rope.attention_factor);
  return s;
}

namespace {

// The checks of one JSON object's fields, each failure naming "meta.json: <path>.<key>".
class Fields {
 public:
  Fields(const json& obj, std::string where, std::string path) : obj_(obj), where_(std::move(where)) {
    prefix_ = path.empty() ? "" : path + ".";
    if (!obj_.is_object()) fail(path.empty() ? "meta.json" : path, "is not a JSON object");
  }
  [[noreturn]] void fail(const std::string& field, const std::string& why) const {
    throw RuntimeError("checkpoint '" + where_ + "': meta.json: " + field + " " + why +
                       " (the file is damaged or was not written by ptrain)");
  }
  const json& need(const std::string& key) const {
    if (!obj_.contains(key)) fail(prefix_ + key, "is missing");
    return obj_[key];
  }
  int64_t integer(const std::string& key, int64_t lo, int64_t hi, std::optional<int64_t> fallback = {}) const {
    if (fallback && !obj_.contains(key)) return *fallback;
    const json& v = need(key);
    if (!v.is_number_integer()) fail(prefix_ + key, "is not an integer");
    bool outside = false;
    if (v.is_number_unsigned()) {  // JSON's non-negative integers
      const uint64_t u = v.get<uint64_t>();
      outside = u > static_cast<uint64_t>(hi) || (lo > 0 && u < static_cast<uint64_t>(lo));
    } else {
      outside = v.get<int64_t>() < lo || v.get<int64_t>() > hi;
    }
    if (outside)
      fail(prefix_ + key, "= " + v.dump() + " is outside [" + std::to_string(lo) + ", " + std::to_string(hi) + "]");
    return v.get<int64_t>();
  }
  double number(const std::string& key, double lo, double hi, std::optional<double> fallback = {}) const {
    if (fallback && !obj_.contains(key)) return *fallback;
    const json& v = need(key);
    if (!v.is_number()) fail(prefix_ + key, "is not a number");
    const double d = v.get<double>();
    if (!(d >= lo && d <= hi)) fail(prefix_ + key, "= " + v.dump() + " is out of range");
    return d;
  }
  void boolean(const std::string& key, bool optional = false) const {
    if (optional && !obj_.contains(key)) return;
    if (!need(key).is_boolean()) fail(prefix_ + key, "is not true or false");
  }
  void string(const std::string& key, bool optional = false) const {
    if (optional && !obj_.contains(key)) return;
    if (!need(key).is_string()) fail(prefix_ + key, "is not a string");
  }

 private:
  const json& obj_;
  std::string where_, prefix_;
};

}  // namespace

void validate_checkpoint_meta(const json& meta, const std::string& where) {
  Fields m(meta, where, "");
  const int64_t version = m.integer("format_version", 0, 1 << 20);
  if (version != kCheckpointFormatVersion)
    throw RuntimeError("checkpoint '" + where + "' has format version " + std::to_string(version) +
                       ", this ptrain reads version " + std::to_string(kCheckpointFormatVersion));
  constexpr int64_t kMax = int64_t{1} << 62;
  m.integer("step", 0, kMax);
  m.integer("samples", 0, kMax);
  m.integer("num_tokens", 0, kMax, 0);
  m.string("data", true);
  m.integer("optimizer_steps", 0, kMax);
  m.integer("world_size", 1, 1 << 20);
  m.string("master_dtype");
  m.boolean("lora", true);
  if (meta.value("lora", false)) {
    Fields l(m.need("lora_config"), where, "lora_config");
    l.integer("rank", 1, 1 << 16);
    l.number("alpha", 1e-30, 1e30);
    l.number("dropout", 0.0, 0.999999);
    l.boolean("rslora", true);
    const json& targets = l.need("targets");
    static const std::set<std::string> known{"q", "k", "v", "o", "gate", "up", "down", "output"};
    if (!targets.is_array()) l.fail("lora_config.targets", "is not a list");
    for (const auto& t : targets)
      if (!t.is_string() || !known.count(t.get<std::string>()))
        l.fail("lora_config.targets", "holds " + t.dump() + ", not one of q, k, v, o, gate, up, down, output");
  }
  // The shape: every size positive and small enough that no product of them overflows.
  Fields s(m.need("shape"), where, "shape");
  const int64_t heads = s.integer("n_heads", 1, 1 << 12), kv = s.integer("n_kv_heads", 1, 1 << 12);
  if (heads % kv != 0) s.fail("shape.n_heads", "is not a multiple of shape.n_kv_heads");
  if (s.integer("head_dim", 2, 1 << 14) % 2 != 0) s.fail("shape.head_dim", "is odd (RoPE rotates pairs)");
  s.integer("dim", 1, 1 << 20);
  s.integer("n_layers", 1, 1 << 12);
  s.integer("ffn_dim", 1, 1 << 22);
  const int64_t vocab = s.integer("vocab_size", 1, 1 << 24);
  s.integer("max_seq_len", 1, 1 << 26);
  s.number("rope_theta", 1e-30, 1e30);
  s.number("norm_eps", 0.0, 1.0);
  s.boolean("tie_embeddings");
  s.string("family", true);
  s.boolean("attention_bias", true);
  s.boolean("mlp_bias", true);
  s.integer("sliding_window", 0, kMax, int64_t{0});
  if (s.integer("padding_idx", -1, kMax, int64_t{-1}) >= vocab)
    s.fail("shape.padding_idx", "is not a row of the embedding (vocab_size " + std::to_string(vocab) + ")");
  Fields r(s.need("rope_scaling"), where, "shape.rope_scaling");
  r.number("factor", 0.0, 1e30);
  r.number("low_freq_factor", -1e30, 1e30);
  r.number("high_freq_factor", -1e30, 1e30);
  r.integer("original_max_seq_len", 0, kMax);
  r.string("type", true);
  const json& rope = s.need("rope_scaling");
  if (rope.contains("type") && !rope_type_named(rope["type"].get<std::string>()))
    r.fail("shape.rope_scaling.type", "= " + rope["type"].dump() + " is not llama3, linear or yarn");
  r.number("beta_fast", -1e30, 1e30, 32.0);
  r.number("beta_slow", -1e30, 1e30, 1.0);
  r.boolean("truncate", true);
  r.number("attention_factor", -1e30, 1e30, 1.0);
  const json& units = m.need("units");
  if (!units.is_array()) m.fail("units", "is not a list");
  for (const auto& u : units) {
    Fields f(u, where, "units[]");
    f.string("name");
    f.integer("numel", 0, kMax);
  }
  if (meta.contains("files")) {
    const json& files = meta["files"];
    if (!files.is_object()) m.fail("files", "is not an object");
    for (const auto& [name, sum] : files.items()) {
      Fields f(sum, where, "files." + name);
      f.integer("bytes", 0, kMax);
      f.string("crc32");
      const std::string crc = sum["crc32"].get<std::string>();
      if (crc.size() != 8 || crc.find_first_not_of("0123456789abcdef") != std::string::npos)
        f.fail("files." + name + ".crc32", "is not 8 hex digits");
    }
  }
}

}  // namespace ptrain
