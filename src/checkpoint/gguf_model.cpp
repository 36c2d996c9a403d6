#include "checkpoint/gguf_model.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <utility>

#include "checkpoint/gguf_reader.h"
#include "checkpoint/hf.h"
#include "common/error.h"
#include "model/layout.h"

namespace ptrain {

using nlohmann::json;

namespace {

// The config.json key transformers' GGUF_CONFIG_MAPPING renames each `{arch}.` key to; "" for
// keys it reads and drops (qwen2 / qwen3's rope.dimension_count).
const std::map<std::string, std::string>& config_mapping(const std::string& model_type) {
  static const std::map<std::string, std::string> llama = {
      {"context_length", "max_position_embeddings"},
      {"block_count", "num_hidden_layers"},
      {"feed_forward_length", "intermediate_size"},
      {"embedding_length", "hidden_size"},
      {"rope.dimension_count", "head_dim"},  // "only suitable for llama/mistral", as transformers notes
      {"rope.freq_base", "rope_theta"},
      {"attention.head_count", "num_attention_heads"},
      {"attention.head_count_kv", "num_key_value_heads"},
      {"attention.layer_norm_rms_epsilon", "rms_norm_eps"},
      {"vocab_size", "vocab_size"},
  };
  static const std::map<std::string, std::string> qwen = [] {
    auto m = llama;
    m["rope.dimension_count"] = "";
    return m;
  }();
  return model_type == "llama" ? llama : qwen;
}

// A metadata value as transformers' _gguf_parse_value gives it: a one-element array is its element.
json json_value(const GgufMeta& m) {
  json out = json::array();
  if (!m.strings.empty())
    for (const auto& s : m.strings) out.push_back(s);
  else if (!m.floats.empty())
    for (double v : m.floats) out.push_back(v);
  else if (m.type == GgufValueType::boolean || m.elem == GgufValueType::boolean)
    for (int64_t v : m.ints) out.push_back(v != 0);
  else
    for (int64_t v : m.ints) out.push_back(v);
  return out.size() == 1 ? out[0] : out;
}

// Keys llama.cpp computes with for these architectures that transformers' loader drops, and the
// values at which dropping them changes nothing.
struct DroppedKey {
  const char* suffix;
  std::vector<double> neutral;
  const char* what;
};
const std::vector<DroppedKey>& dropped_keys() {
  static const std::vector<DroppedKey> keys = {
      {"expert_count", {0}, "mixture-of-experts layers"},
      {"logit_scale", {0, 1}, "the logits scaled"},
      {"embedding_scale", {0, 1}, "the embeddings scaled"},
      {"residual_scale", {0, 1}, "the residual branches scaled"},
      {"attention.scale", {0}, "an attention scale other than 1/sqrt(head_dim)"},
      {"attn_logit_softcapping", {0}, "attention logits soft-capped"},
      {"final_logit_softcapping", {0}, "the output logits soft-capped"},
      {"attention.clamp_kqv", {0}, "q/k/v clamped"},
      {"rope.scaling.attn_factor", {1}, "RoPE's cos and sin scaled"},
  };
  return keys;
}

const char* kBothReaders =
    "transformers' GGUF loader drops it, llama.cpp computes with it: the file's two readers run different "
    "networks";
const char* kReadAsLlamaCpp = "set model.gguf_reader = \"llama.cpp\" to train the network llama.cpp runs";

// The config dict transformers' load_gguf_checkpoint builds ("config"), and the metadata keys it
// reads for it (the rest is ignored, as there). Refuses what ptrain cannot train as both read it.
json transformers_config(const GgufFile& f, std::set<std::string>& read) {
  const std::string& path = f.path();
  const auto arch = f.string("general.architecture");
  if (!arch) throw UnsupportedInput(path + ": no general.architecture (a GGUF model file names its architecture)");
  read.insert("general.architecture");
  // llama.cpp runs Mistral as its llama architecture; transformers builds MistralConfig where
  // general.name is "mistral" (its check is membership in a list of one value: equality), then
  // finds no tensor map for it in gguf-py: both refuse that name.
  if (const GgufMeta* name = f.find("general.name"); name && *arch == "llama") {
    read.insert("general.name");
    if (name->strings == std::vector<std::string>{"mistral"})
      throw UnsupportedInput(path + ": general.name \"mistral\": transformers' GGUF loader builds MistralConfig " +
                             "(a 4096-token window) for a llama file of that name and then fails (gguf-py has no " +
                             "\"mistral\" tensor map), llama.cpp runs it as Llama: rename it (gguf-py's " +
                             "gguf_set_metadata) to train it as llama.cpp runs it");
  }
  if (*arch != "llama" && *arch != "qwen2" && *arch != "qwen3")
    throw UnsupportedInput(path + ": general.architecture \"" + *arch +
                           "\" is not one ptrain reads (llama — Mistral too —, qwen2, qwen3); see docs/models.md");
  json c = json::object();
  c["model_type"] = *arch;
  const auto& mapping = config_mapping(*arch);
  const std::string prefix = *arch + ".";
  for (const auto& [key, meta] : f.metadata()) {
    if (!key.starts_with(prefix)) continue;
    const std::string suffix = key.substr(prefix.size());
    auto m = mapping.find(suffix);
    if (m == mapping.end()) continue;
    read.insert(key);
    if (m->second.empty()) continue;
    const json v = json_value(meta);
    if (v.is_array() || v.is_string())
      throw UnsupportedInput(path + ": " + key + " is " + meta.type_name() +
                             " (per-layer values?): ptrain reads one number for it, as config.json's " + m->second);
    c[m->second] = v;
  }
  // The special token ids go into the config too (GGUF_CONFIG_MAPPING's "tokenizer" entry): the
  // padding id becomes the embedding's padding_idx, whose row receives no gradient.
  for (const auto& [key, name] :
       std::vector<std::pair<std::string, std::string>>{{"tokenizer.ggml.bos_token_id", "bos_token_id"},
                                                        {"tokenizer.ggml.eos_token_id", "eos_token_id"},
                                                        {"tokenizer.ggml.unknown_token_id", "unk_token_id"},
                                                        {"tokenizer.ggml.padding_token_id", "pad_token_id"}})
    if (const GgufMeta* m = f.find(key)) {
      read.insert(key);
      c[name] = json_value(*m);
    }
  bool has_output = false;
  for (const auto& t : f.tensors()) has_output = has_output || t.name == "output.weight";
  c["tie_word_embeddings"] = !has_output;
  if (!c.contains("vocab_size")) {
    if (const auto* tokens = f.strings("tokenizer.ggml.tokens")) c["vocab_size"] = tokens->size();
  }
  return c;
}

// llama.cpp's RoPE scaling of a file: `rope.scaling.type` (llama.cpp's default where absent:
// linear) and its factor (0 and 1: none).
struct GgufRopeScaling {
  std::string type;
  double factor = 0.0;
  bool scales() const { return type != "none" && factor != 0.0 && factor != 1.0; }
};
GgufRopeScaling gguf_rope_scaling(const GgufFile& f, std::set<std::string>& read) {
  const std::string a = *f.string("general.architecture") + ".";
  GgufRopeScaling r{f.string(a + "rope.scaling.type").value_or("linear"),
                    f.number(a + "rope.scaling.factor").value_or(0)};
  for (const char* k : {"rope.scaling.type", "rope.scaling.factor"})
    if (f.find(a + k)) read.insert(a + k);
  return r;
}

// Metadata and tensors llama.cpp reads for these architectures and transformers does not,
// refused unless they change nothing — or, with llama.cpp's reading, read as llama.cpp
// computes with them (llama_cpp_config) where ptrain builds that network.
void refuse_dropped(const GgufFile& f, const LlamaShape& s, std::set<std::string>& read, GgufReader reader) {
  const std::string& path = f.path();
  const std::string a = *f.string("general.architecture") + ".";
  const bool llama_cpp = reader == GgufReader::llama_cpp;
  std::vector<std::string> why;
  const GgufRopeScaling scaling = gguf_rope_scaling(f, read);
  const std::string named = f.string(a + "rope.scaling.type")
                                ? a + "rope.scaling.type = \"" + scaling.type + "\""
                                : a + "rope.scaling.factor = " + json(scaling.factor).dump();
  if (scaling.scales() && !(llama_cpp && scaling.type == "linear"))
    why.push_back(named + ": RoPE scaling; " +
                  (llama_cpp ? "ptrain reads llama.cpp's linear scaling and Llama 3.1's rope_freqs, not this one "
                               "(llama.cpp's YaRN takes factors from the run's own context settings); fine-tune the "
                               "Hugging Face release instead"
                             : std::string(kBothReaders) + "; " + kReadAsLlamaCpp));
  if (f.tensor("rope_freqs.weight") && !llama_cpp)
    why.push_back(std::string("tensor rope_freqs.weight: Llama 3.1's RoPE scaling as frequency divisors; ") +
                  kBothReaders + "; " + kReadAsLlamaCpp);
  for (const char* k : {"attention.key_length", "attention.value_length", "rope.dimension_count"}) {
    const auto v = f.integer(a + k);
    if (!v) continue;
    read.insert(a + k);
    if (*v != s.head_dim)
      why.push_back(a + k + " = " + std::to_string(*v) + " but the config transformers builds has heads " +
                    std::to_string(s.head_dim) + " wide" +
                    (s.family == Family::qwen3   ? " (it reads no head width for qwen3: Qwen3Config's default, 128)"
                     : s.family == Family::qwen2 ? " (hidden_size / num_attention_heads)"
                                                 : " (rope.dimension_count)") +
                    ": llama.cpp would " +
                    (std::string(k) == "rope.dimension_count" ? "rotate part of each head only" : "attend otherwise"));
  }
  for (const auto& d : dropped_keys()) {
    const auto v = f.number(a + d.suffix);
    if (!v) continue;
    read.insert(a + d.suffix);
    if (std::find(d.neutral.begin(), d.neutral.end(), *v) == d.neutral.end())
      why.push_back(a + d.suffix + " = " + json(*v).dump() + ": " + d.what + "; " + kBothReaders);
  }
  if (why.empty()) return;
  std::string msg = path + ": cannot be trained as its readers read it:";
  for (const auto& w : why) msg += "\n  - " + w;
  throw UnsupportedInput(msg);
}

std::string shape_str(const std::vector<int64_t>& v) { return c10::str(c10::IntArrayRef(v)); }

// Llama 3.1's scaling whose divisors are `file`'s (rope_freqs, within the float32 rounding of
// llama.cpp's converter, which computes them in float32). Only the bands' wavelengths — original /
// high_freq_factor and original / low_freq_factor — shape the network, so one original length
// stands for any (8192, or a quarter of a shorter context), and the candidates are: the Llama 3.x
// values (factor the largest divisor, low 1, high 4); low and high fitted to two divisors between
// the bands; where no divisor lies between them, bands that split the file's divisors of 1 from
// those of the factor. Empty where none gives the file's divisors.
std::optional<RopeScaling> llama3_scaling_of(const std::vector<double>& file, LlamaShape s) {
  const double factor = *std::max_element(file.begin(), file.end());
  const auto matches = [&](const RopeScaling& r) {
    if (!(r.low_freq_factor > 0) || !(r.high_freq_factor > r.low_freq_factor)) return false;
    s.rope_scaling = r;
    const at::Tensor mine = llama3_rope_divisors(s).to(at::kDouble);
    for (size_t i = 0; i < file.size(); ++i)
      if (std::abs(mine[static_cast<int64_t>(i)].item<double>() - file[i]) > 1e-5 * file[i]) return false;
    return true;
  };
  RopeScaling r;
  r.type = RopeType::llama3;
  r.factor = factor;
  if (matches(r) || factor <= 1) return r;
  // any length stands for the original; one below the model's context, as transformers expects
  if (s.max_seq_len <= r.original_max_seq_len) r.original_max_seq_len = std::max<int64_t>(1, s.max_seq_len / 4);
  const double original = static_cast<double>(r.original_max_seq_len);
  // original / wavelength of pair i, in which the ramp between the bands is linear
  const auto x = [&](size_t i) {
    const double freq = 1.0 / std::pow(s.rope_theta, 2.0 * static_cast<double>(i) / static_cast<double>(s.head_dim));
    return original * freq / (2 * M_PI);
  };
  std::vector<size_t> between;
  for (size_t i = 0; i < file.size(); ++i)
    if (file[i] > 1 + 1e-5 && file[i] < factor * (1 - 1e-5)) between.push_back(i);
  if (between.size() >= 2) {
    // 1 / divisor = (1 - t) / factor + t, with t = (x - low) / (high - low)
    const auto t = [&](size_t i) { return (1 / file[i] - 1 / factor) / (1 - 1 / factor); };
    const size_t a = between.front(), b = between.back();
    const double slope = (t(b) - t(a)) / (x(b) - x(a));
    r.low_freq_factor = x(a) - t(a) / slope;
    r.high_freq_factor = r.low_freq_factor + 1 / slope;
    // the fit carries the divisors' float32 rounding: their nearest 6-digit values where those fit
    const auto rounded = [](double v) {
      const double scale = std::pow(10.0, 5 - std::floor(std::log10(std::abs(v))));
      return std::round(v * scale) / scale;
    };
    RopeScaling round = r;
    round.low_freq_factor = rounded(r.low_freq_factor);
    round.high_freq_factor = rounded(r.high_freq_factor);
    if (std::isfinite(round.low_freq_factor) && matches(round)) return round;
  } else if (between.empty()) {
    // the last pair of divisor 1 and the first of the factor (x falls along the pairs): both
    // bands' edges between them, a third and two thirds of the way in x
    size_t last_one = 0;
    while (last_one + 1 < file.size() && file[last_one + 1] <= 1 + 1e-5) ++last_one;
    if (last_one + 1 >= file.size() || file[0] > 1 + 1e-5) return std::nullopt;
    const double x1 = x(last_one), xf = x(last_one + 1);
    r.high_freq_factor = xf + (x1 - xf) * 2 / 3;
    r.low_freq_factor = xf + (x1 - xf) / 3;
  }
  if (matches(r)) return r;
  return std::nullopt;
}

// llama.cpp's reading (model.gguf_reader = "llama.cpp"): what transformers' loader drops and
// llama.cpp computes with, added to `c` as config.json holds it where ptrain builds that network —
// rope_freqs as Llama 3.1's scaling, linear scaling (`rope.scaling.type` linear, or a factor
// without a type: llama.cpp's default type), Llama's attention biases (on q, k, v and o in every
// layer). `s` is the shape transformers' config gives; refuse_dropped refuses the rest.
void llama_cpp_config(const GgufFile& f, const LlamaShape& s, json& c, std::set<std::string>& read) {
  const std::string& path = f.path();
  const GgufRopeScaling scaling = gguf_rope_scaling(f, read);
  const GgufTensorInfo* freqs = f.tensor("rope_freqs.weight");
  if (freqs && scaling.scales())
    throw UnsupportedInput(path + ": rope_freqs.weight and " + scaling.type + " RoPE scaling by " +
                           json(scaling.factor).dump() + ": llama.cpp applies both, which no config.json describes");
  if (freqs) {
    if (s.family != Family::llama)
      throw UnsupportedInput(path + ": tensor rope_freqs.weight: llama.cpp's " + traits(s.family).name +
                             " architecture does not read it (llama.cpp refuses the file)");
    if (freqs->shape != std::vector<int64_t>{s.head_dim / 2})
      throw UnsupportedInput(path + ": tensor rope_freqs.weight has shape " + shape_str(freqs->shape) +
                             "; llama.cpp reads one divisor per rotated pair, [" + std::to_string(s.head_dim / 2) +
                             "]");
    const at::Tensor d = f.dequantize(*freqs).to(at::kDouble).contiguous();
    const std::vector<double> divisors(d.data_ptr<double>(), d.data_ptr<double>() + d.numel());
    for (double v : divisors)
      if (!std::isfinite(v) || v < 1)
        throw UnsupportedInput(path + ": tensor rope_freqs.weight holds " + json(v).dump() +
                               ": Llama 3.1's divisors are finite and at least 1");
    const auto r = llama3_scaling_of(divisors, s);
    if (!r)
      throw UnsupportedInput(path +
                             ": tensor rope_freqs.weight: these frequency divisors are not Llama 3.1's scaling "
                             "(1 at short wavelengths, the factor at long ones, a smooth ramp between), the one "
                             "form ptrain builds");
    if (r->factor > 1)
      c["rope_scaling"] = {{"rope_type", "llama3"},
                           {"factor", r->factor},
                           {"low_freq_factor", r->low_freq_factor},
                           {"high_freq_factor", r->high_freq_factor},
                           {"original_max_position_embeddings", r->original_max_seq_len}};
  } else if (scaling.scales() && scaling.type == "linear") {
    c["rope_scaling"] = {{"rope_type", "linear"}, {"factor", scaling.factor}};
  }
  if (s.family == Family::llama && f.tensor("blk.0.attn_q.bias")) c["attention_bias"] = true;
}

}  // namespace

at::Tensor llama3_rope_divisors(const LlamaShape& s) {
  const RopeScaling& r = s.rope_scaling;
  const double old_len = static_cast<double>(r.original_max_seq_len);
  const double low_wavelen = old_len / r.low_freq_factor, high_wavelen = old_len / r.high_freq_factor;
  std::vector<float> f;
  for (int64_t i = 0; i < s.head_dim; i += 2) {
    const double freq = 1.0 / std::pow(s.rope_theta, static_cast<double>(i) / static_cast<double>(s.head_dim));
    const double wavelen = 2 * M_PI / freq;
    if (wavelen < high_wavelen) {
      f.push_back(1.0f);
    } else if (wavelen > low_wavelen) {
      f.push_back(static_cast<float>(r.factor));
    } else {
      const double smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
      f.push_back(static_cast<float>(1.0 / ((1 - smooth) / r.factor + smooth)));
    }
  }
  return at::tensor(f, at::kFloat);
}

std::string gguf_model_file(const std::string& hf_path) {
  return gguf_file_at(hf_path, "config.json", "model.hf_path");
}

std::vector<GgufTensorName> gguf_tensor_names(const LlamaShape& s) {
  const bool permute = s.family == Family::llama || s.family == Family::mistral;
  std::vector<GgufTensorName> out{{"token_embd.weight", "model.embed_tokens.weight"}};
  for (int64_t l = 0; l < s.n_layers; ++l) {
    const std::string hf = "model.layers." + std::to_string(l) + ".", g = "blk." + std::to_string(l) + ".";
    auto add = [&](const std::string& gguf, const std::string& name, int64_t heads = 0) {
      out.push_back({g + gguf, hf + name, permute ? heads : 0});
    };
    add("attn_norm.weight", "input_layernorm.weight");
    for (const std::string p : {"weight", "bias"}) {
      if (p == "bias" && !s.qkv_bias()) continue;
      add("attn_q." + p, "self_attn.q_proj." + p, s.n_heads);
      add("attn_k." + p, "self_attn.k_proj." + p, s.n_kv_heads);
      add("attn_v." + p, "self_attn.v_proj." + p);
    }
    add("attn_output.weight", "self_attn.o_proj.weight");
    if (s.o_bias()) add("attn_output.bias", "self_attn.o_proj.bias");
    if (s.qk_norm()) {
      add("attn_q_norm.weight", "self_attn.q_norm.weight");
      add("attn_k_norm.weight", "self_attn.k_norm.weight");
    }
    add("ffn_norm.weight", "post_attention_layernorm.weight");
    add("ffn_gate.weight", "mlp.gate_proj.weight");
    add("ffn_up.weight", "mlp.up_proj.weight");
    add("ffn_down.weight", "mlp.down_proj.weight");
  }
  out.push_back({"output_norm.weight", "model.norm.weight"});
  if (!s.tie_embeddings) out.push_back({"output.weight", "lm_head.weight"});  // tied: llama.cpp reads token_embd
  return out;
}

at::Tensor permute_qk_rows(const at::Tensor& w, int64_t heads, bool inverse) {
  const int64_t half = w.size(0) / heads / 2;
  std::vector<int64_t> split = inverse ? std::vector<int64_t>{heads, half, 2} : std::vector<int64_t>{heads, 2, half};
  for (int64_t i = 1; i < w.dim(); ++i) split.push_back(w.size(i));
  return w.reshape(split).transpose(1, 2).reshape(w.sizes());
}

GgufModel::GgufModel(const std::string& path, GgufReader reader)
    : file_(std::make_unique<GgufFile>(path)), config_(std::make_unique<json>()), reader_(reader) {
  std::set<std::string> read{"general.alignment"};  // the file's layout, which the reader applies
  if (const int64_t parts = file_->split_count(); parts > 1) {
    // A split model: llama.cpp reads every part; transformers' loader this file alone, leaving the
    // other parts' weights at their random initialization.
    if (reader == GgufReader::transformers && file_->split_no() == 0)
      throw UnsupportedInput(
          path + ": the first of " + std::to_string(parts) + " parts of a split model (llama.cpp's gguf-split, " +
          "split.count = " + std::to_string(parts) + "), holding " + std::to_string(file_->tensors().size()) +
          " of its tensors: transformers' GGUF loader reads this file alone and leaves the other parts' weights " +
          "at random, llama.cpp reads every part; set model.gguf_reader = \"llama.cpp\" to read them all, or " +
          "merge the parts into one file (llama.cpp's llama-gguf-split --merge)");
    file_->add_split_parts();
    read.insert({"split.no", "split.count", "split.tensors.count"});
  }
  *config_ = transformers_config(*file_, read);
  const std::string as_read =
      path + (reader == GgufReader::llama_cpp ? " (its metadata as llama.cpp reads it)"
                                              : " (its metadata as transformers' GGUF loader reads it)");
  shape_ = hf_config_shape(*config_, as_read);
  // Bounds before anything is sized by the shape (the config's validation names them again).
  const std::string a = *file_->string("general.architecture") + ".";
  for (const auto& [value, key, bound] : {std::make_tuple(shape_.n_layers, a + "block_count", kMaxLayers),
                                          std::make_tuple(shape_.dim, a + "embedding_length", kMaxWidth),
                                          std::make_tuple(shape_.ffn_dim, a + "feed_forward_length", kMaxWidth),
                                          std::make_tuple(shape_.n_heads, a + "attention.head_count", kMaxWidth),
                                          std::make_tuple(shape_.n_kv_heads, a + "attention.head_count_kv", kMaxWidth),
                                          std::make_tuple(shape_.head_dim, std::string("the head width"), kMaxWidth),
                                          std::make_tuple(shape_.vocab_size, a + "vocab_size", kMaxVocab)})
    if (value < 1 || value > bound)
      throw UnsupportedInput(path + ": " + key + " = " + std::to_string(value) + " is outside [1, " +
                             std::to_string(bound) + "]");
  if (reader == GgufReader::llama_cpp) {
    llama_cpp_config(*file_, shape_, *config_, read);
    shape_ = hf_config_shape(*config_, as_read);
  }
  refuse_dropped(*file_, shape_, read, reader);
  for (const auto& [key, meta] : file_->metadata())
    if (!read.count(key) && !key.starts_with("tokenizer.")) ignored_.push_back(key);
  for (auto& n : gguf_tensor_names(shape_)) by_hf_[n.hf] = n;
}

GgufModel::~GgufModel() = default;

const std::string& GgufModel::path() const { return file_->path(); }

std::string GgufModel::ignored_note() const {
  std::string keys;
  for (const auto& k : ignored_) keys += (keys.empty() ? "" : ", ") + k;
  if (keys.empty()) return keys;
  return path() +
         (reader_ == GgufReader::llama_cpp
              ? ": metadata neither llama.cpp nor transformers' GGUF loader shapes the model by, ignored: "
              : ": metadata transformers' GGUF loader does not read for the model, ignored as it ignores it: ") +
         keys;
}

at::Tensor GgufModel::tensor(const std::string& hf) const {
  auto it = by_hf_.find(hf);
  const GgufTensorInfo* t = it == by_hf_.end() ? nullptr : file_->tensor(it->second.gguf);
  if (!t) throw RuntimeError(path() + ": no tensor for " + hf);
  at::Tensor w = file_->dequantize(*t);
  return it->second.permute_heads > 0 ? permute_qk_rows(w, it->second.permute_heads, /*inverse=*/true) : w;
}

void GgufModel::verify() const {
  std::map<std::string, std::vector<int64_t>> want;  // by GGUF name
  std::map<std::string, std::string> hf_of;
  for (const auto& unit : llama_units(shape_, 0.0))
    for (const auto& slot : unit.slots) {
      auto it = by_hf_.find(slot.name);
      TORCH_CHECK(it != by_hf_.end(), "no GGUF name for ", slot.name);
      want[it->second.gguf] = slot.shape;
      hf_of[it->second.gguf] = slot.name;
    }
  std::vector<std::string> problems;
  const std::string family = traits(shape_.family).name;
  for (const auto& t : file_->tensors()) {
    if (t.name == "rope_freqs.weight" && reader_ == GgufReader::llama_cpp) continue;  // read as the config's scaling
    auto w = want.find(t.name);
    if (w == want.end()) {
      const bool llama_bias = shape_.family != Family::qwen2 && t.name.starts_with("blk.") &&
                              t.name.ends_with(".bias") && t.name.find(".attn_") != std::string::npos;
      problems.push_back(
          "tensor '" + t.name + "' is not part of a " + family + " model of this metadata" +
          (llama_bias && reader_ == GgufReader::transformers
               ? std::string(" (attention biases: transformers' GGUF loader builds Llama without them and drops "
                             "the tensor, llama.cpp adds them; ") +
                     kReadAsLlamaCpp + ")"
           : llama_bias ? " (ptrain reads Llama's attention biases where q, k, v and o have them in every layer)"
                        : " (transformers' GGUF loader would drop it; ptrain leaves nothing unused)"));
      continue;
    }
    if (t.shape != w->second)
      problems.push_back("tensor '" + t.name + "' (" + hf_of[t.name] + ") has shape " + shape_str(t.shape) +
                         ", the metadata gives " + shape_str(w->second));
    else if (!ggml_type_info(t.type))
      problems.push_back("tensor '" + t.name + "' is " + t.type_name() + ", which ptrain does not dequantize (" +
                         kGgmlTypesRead + ")");
  }
  for (const auto& [name, dims] : want)
    if (!file_->tensor(name))
      problems.push_back("tensor '" + name + "' (" + hf_of[name] + ", " + shape_str(dims) + ") is missing");
  if (problems.empty()) return;
  std::string msg = path() + ": the tensors do not match the model its metadata describes:";
  constexpr size_t kShown = 12;
  for (size_t i = 0; i < std::min(problems.size(), kShown); ++i) msg += "\n  " + problems[i];
  if (problems.size() > kShown) msg += "\n  ... and " + std::to_string(problems.size() - kShown) + " more";
  throw UnsupportedInput(msg);
}

LlamaShape read_model_config(const std::string& hf_path, GgufReader reader) {
  const std::string gguf = gguf_model_file(hf_path);
  return gguf.empty() ? read_hf_config(hf_path) : GgufModel(gguf, reader).shape();
}

std::string model_ignored_note(const std::string& hf_path, GgufReader reader) {
  const std::string gguf = gguf_model_file(hf_path);
  return gguf.empty() ? hf_config_ignored_note(hf_path) : GgufModel(gguf, reader).ignored_note();
}

}  // namespace ptrain
