#include "app/export_gguf.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>

#include "app/export.h"
#include "checkpoint/checkpoint.h"
#include "checkpoint/gguf_model.h"
#include "checkpoint/hf.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"
#include "common/log.h"
#include "config/config.h"
#include "tokenizer/chat.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// llama.cpp's architecture for a family: Mistral is its llama (q/k rows permuted for ggml's
// "normal" RoPE over interleaved pairs: gguf_tensor_names), Qwen's run the "neox" RoPE as HF.
struct Arch {
  const char* name;
};
Arch arch_of(const LlamaShape& s) {
  switch (s.family) {
    case Family::llama:
    case Family::mistral:
      return {"llama"};
    case Family::qwen2:
      return {"qwen2"};
    case Family::qwen3:
      return {"qwen3"};
  }
  return {"llama"};
}

void refuse_unexpressible(const LlamaShape& s, const HfStorage& storage, const std::string& dir) {
  std::vector<std::string> why;
  if (storage.nf4)
    why.push_back(
        "config.json quantization_config: bitsandbytes NF4 weights (GGUF holds ggml's own types; "
        "train on it and export the checkpoint, whose merged weights are float)");
  if (s.mlp_biased())
    why.push_back("mlp_bias = true: biases on gate/up/down, which llama.cpp's converter does not write for Llama");
  if (s.sliding_window > 0)
    why.push_back("sliding_window = " + std::to_string(s.sliding_window) +
                  ": llama.cpp runs Mistral as its llama architecture, which attends to every position — the "
                  "model would answer differently past the window");
  const RopeScaling& r = s.rope_scaling;
  if (r.factor > 0 && r.type == RopeType::yarn) {
    // llama.cpp reads a YaRN file's type, factor and original context only: it ramps between
    // beta_fast 32 and beta_slow 1 rounded outward, and scales cos/sin by 0.1 ln(factor) + 1.
    auto number = [](double v) { return nlohmann::json(v).dump(); };
    if (r.beta_fast != 32.0 || r.beta_slow != 1.0)
      why.push_back("rope_scaling yarn beta_fast = " + number(r.beta_fast) + ", beta_slow = " + number(r.beta_slow) +
                    ": llama.cpp runs YaRN with 32 and 1 whatever the file says");
    if (!r.truncate)
      why.push_back("rope_scaling yarn truncate = false: llama.cpp rounds the ramp's ends to whole dimensions");
    const double mscale = RopeScaling::yarn_mscale(r.factor);
    if (std::abs(r.attention_factor - mscale) > 1e-6 * mscale)
      why.push_back("rope_scaling yarn attention factor " + number(r.attention_factor) +
                    ": llama.cpp scales cos/sin by 0.1 ln(factor) + 1 = " + number(mscale));
  }
  if (why.empty()) return;
  std::string msg = dir + ": cannot be written as GGUF:";
  for (const auto& w : why) msg += "\n  - " + w;
  throw UnsupportedInput(msg);
}

uint32_t file_type(GgmlType t) {  // llama.cpp's LLAMA_FTYPE_*: ALL_F32, MOSTLY_F16, MOSTLY_Q8_0, MOSTLY_BF16
  switch (t) {
    case GgmlType::f32:
      return 0;
    case GgmlType::f16:
      return 1;
    case GgmlType::q8_0:
      return 7;
    case GgmlType::bf16:
      return 32;
    default:  // export writes only the four above (--gguf-type)
      break;
  }
  throw RuntimeError(std::string("no llama.cpp file type for ") + ggml_type_name(t));
}

void add_model_metadata(GgufWriter& w, const LlamaShape& s, const Arch& arch, const std::string& name, GgmlType type) {
  const std::string a = arch.name;
  auto u32 = [](int64_t v) { return static_cast<uint32_t>(v); };
  w.add("general.architecture", a);
  w.add("general.name", name);
  w.add("general.file_type", file_type(type));
  w.add("general.quantization_version", uint32_t{2});
  w.add(a + ".context_length", u32(s.max_seq_len));
  w.add(a + ".embedding_length", u32(s.dim));
  w.add(a + ".block_count", u32(s.n_layers));
  w.add(a + ".feed_forward_length", u32(s.ffn_dim));
  w.add(a + ".attention.head_count", u32(s.n_heads));
  w.add(a + ".attention.head_count_kv", u32(s.n_kv_heads));
  w.add(a + ".rope.freq_base", static_cast<float>(s.rope_theta));
  w.add(a + ".attention.layer_norm_rms_epsilon", static_cast<float>(s.norm_eps));
  w.add(a + ".vocab_size", u32(s.vocab_size));
  w.add(a + ".rope.dimension_count", u32(s.head_dim));
  if (s.head_dim * s.n_heads != s.dim) {
    w.add(a + ".attention.key_length", u32(s.head_dim));
    w.add(a + ".attention.value_length", u32(s.head_dim));
  }
  if (s.rope_scaling.factor > 0 && s.rope_scaling.type == RopeType::linear) {
    w.add(a + ".rope.scaling.type", std::string("linear"));
    w.add(a + ".rope.scaling.factor", static_cast<float>(s.rope_scaling.factor));
  }
  if (s.rope_scaling.factor > 0 && s.rope_scaling.type == RopeType::yarn) {  // as llama.cpp's converter writes it
    w.add(a + ".rope.scaling.type", std::string("yarn"));
    w.add(a + ".rope.scaling.factor", static_cast<float>(s.rope_scaling.factor));
    w.add(a + ".rope.scaling.original_context_length", u32(s.rope_scaling.original_max_seq_len));
  }
}

// The model's tensors under llama.cpp's names, in its converter's order (Llama 3.1's RoPE factors
// after the embedding).
void add_model_tensors(GgufWriter& w, const HfCheckpoint& ckpt, const LlamaShape& s, GgmlType type) {
  for (const GgufTensorName& n : gguf_tensor_names(s)) {
    const std::vector<int64_t> shape = ckpt.tensor(n.hf).sizes().vec();
    GgmlType t = shape.size() == 1 ? GgmlType::f32 : type;
    if (t == GgmlType::q8_0 && shape.back() % 32 != 0) {
      log::info(n.gguf, ": rows of ", shape.back(), " elements are no multiple of Q8_0's 32: written as F16");
      t = GgmlType::f16;
    }
    w.add_tensor(n.gguf, shape, t, [&ckpt, n] {
      at::Tensor v = ckpt.tensor(n.hf).to(at::kFloat);
      return n.permute_heads > 0 ? permute_qk_rows(v, n.permute_heads) : v;
    });
    if (n.gguf == "token_embd.weight" && s.rope_scaling.factor > 0 && s.rope_scaling.type == RopeType::llama3) {
      const at::Tensor factors = llama3_rope_divisors(s);
      w.add_tensor("rope_freqs.weight", {factors.numel()}, GgmlType::f32, [factors] { return factors; });
    }
  }
}

// llama.cpp's name for a byte-level pre-tokenizer (`tokenizer.ggml.pre`), by what it splits with.
// Its converter recognizes a tokenizer by hashing what it makes of a test text; these are the
// splits of the families ptrain reads, which its converter names so (Mistral Nemo's Tekken:
// "tekken"), each the split transformers' GGUF loader gives that name back.
std::string pre_tokenizer_name(const json& pre, const std::string& where) {
  auto byte_level = [](const json& p, bool regex) {
    return p.is_object() && p.value("type", "") == "ByteLevel" && p.value("use_regex", true) == regex &&
           !p.value("add_prefix_space", false);
  };
  if (byte_level(pre, true)) return "gpt-2";
  const json& seq = pre.is_object() && pre.value("type", "") == "Sequence" ? pre["pretokenizers"] : json();
  if (seq.is_array() && seq.size() == 2) {
    const json& first = seq[0];
    if (first.value("type", "") == "Split" && first.value("behavior", "") == "Isolated" &&
        !first.value("invert", false) && first.contains("pattern") && first["pattern"].contains("Regex") &&
        byte_level(seq[1], false)) {
      const std::string r = first["pattern"]["Regex"].get<std::string>();
      for (const char* name : {"llama-bpe", "qwen2", "tekken"}) {
        const char* split = gguf_pre_tokenizer_split(name);
        if (split && r == split) return name;
      }
    }
    if (first.value("type", "") == "Digits" && first.value("individual_digits", false) && byte_level(seq[1], true))
      return "smollm";
  }
  throw UnsupportedInput(where + ": pre_tokenizer " + pre.dump().substr(0, 300) +
                         " is none llama.cpp names (tokenizer.ggml.pre: Llama 3's split, Qwen2's, Tekken's, GPT-2's "
                         "byte level, SmolLM's digits); not written rather than split differently there");
}

// BOS / EOS as transformers resolves them for the directory, whether its tokenizer adds them, and
// its default chat template.
void add_special_tokens(GgufWriter& w, const std::string& dir) {
  const Tokenizer tok(dir);
  const auto specials = tok.template_tokens();
  auto id_of = [&](const std::string& t) { return t.empty() ? std::nullopt : tok.id_of(t); };
  const auto bos = specials ? id_of(specials->first) : std::nullopt;
  const auto eos = specials ? id_of(specials->second) : std::nullopt;
  if (bos) w.add("tokenizer.ggml.bos_token_id", static_cast<uint32_t>(*bos));
  if (eos) w.add("tokenizer.ggml.eos_token_id", static_cast<uint32_t>(*eos));
  const std::vector<int32_t> probe = tok.encode_with_special_tokens("a");
  w.add("tokenizer.ggml.add_bos_token", bos && !probe.empty() && probe.front() == *bos);
  w.add("tokenizer.ggml.add_eos_token", eos && !probe.empty() && probe.back() == *eos);
  std::string template_source;
  const std::string chat = default_chat_template(dir, template_source);
  if (!chat.empty()) w.add("tokenizer.chat_template", chat);
}

// A SentencePiece-style BPE (Llama 2, Mistral, TinyLlama as tokenizer.json holds them: byte
// fallback, `▁` for spaces through Metaspace or the legacy Prepend + Replace normalizer):
// whether `j` is one, and whether it prefixes a space to the text (llama.cpp's add_space_prefix).
std::optional<bool> sentencepiece_space_prefix(const json& j) {
  const json& model = j.at("model");
  if (!model.value("byte_fallback", false)) return std::nullopt;
  const json pre = j.value("pre_tokenizer", json());
  if (pre.is_object() && pre.value("type", "") == "Metaspace" && pre.value("replacement", "") == "\u2581" &&
      !pre.value("split", true))
    return pre.value("prepend_scheme", "always") != "never";
  const json norm = j.value("normalizer", json());
  if (pre.is_null() && norm.is_object() && norm.value("type", "") == "Sequence" && norm["normalizers"].size() == 2 &&
      norm["normalizers"][0].value("type", "") == "Prepend" && norm["normalizers"][1].value("type", "") == "Replace")
    return true;
  return std::nullopt;
}

// Scores for llama.cpp's SentencePiece tokenizer, which merges the adjacent pair whose merged
// token scores highest: minus the rank of the first merge that makes the token (transformers
// wrote the merges from SentencePiece's scores in that order), so it merges as the BPE does;
// tokens no merge makes (characters, bytes, specials) score below every merge.
std::vector<float> merge_scores(const std::vector<std::string>& tokens, const std::vector<std::string>& merges) {
  std::map<std::string, size_t> rank;
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ');
    rank.emplace(m.substr(0, sp) + m.substr(sp + 1), r);  // keeps the first (lowest) rank
  }
  std::vector<float> scores(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) {
    const auto it = rank.find(tokens[i]);
    scores[i] = -static_cast<float>(it != rank.end() ? it->second : merges.size() + i);
  }
  return scores;
}

void add_tokenizer_metadata(GgufWriter& w, const std::string& dir, int64_t vocab_size) {
  const fs::path file = hf_tokenizer_file(dir);  // tokenizer.json, or the file fast_tokenizer_files names
  if (!fs::is_regular_file(file))
    throw UnsupportedInput("no tokenizer.json in " + dir +
                           ": llama.cpp needs the vocabulary inside the GGUF (data.tokenizer names another directory)");
  const json j = read_json_file(file.string());
  const std::string where = file.string();
  const json& model = j.at("model");
  if (model.value("type", "") != "BPE")
    throw UnsupportedInput(where + ": model type " + model.value("type", "?") + " is not BPE");
  for (const char* k : {"continuing_subword_prefix", "end_of_word_suffix", "dropout"})
    if (model.contains(k) && !model[k].is_null() && !(model[k].is_string() && model[k].get<std::string>().empty()))
      throw UnsupportedInput(where + ": model." + k + " is set: llama.cpp's BPE has no such option");
  const std::optional<bool> space_prefix = sentencepiece_space_prefix(j);
  if (!space_prefix && model.value("byte_fallback", false))
    throw UnsupportedInput(where +
                           ": byte_fallback with a pre-tokenizer / normalizer other than SentencePiece's "
                           "(Metaspace, or Prepend + Replace): llama.cpp has no such tokenizer");
  // byte-level BPE: llama.cpp's name for its split; SentencePiece: none
  const std::string pre = space_prefix ? "" : pre_tokenizer_name(j.value("pre_tokenizer", json()), where);

  // Token types: 1 NORMAL, 2 UNKNOWN, 3 CONTROL, 4 USER_DEFINED, 5 UNUSED, 6 BYTE.
  std::vector<std::string> tokens(static_cast<size_t>(vocab_size));
  std::vector<int32_t> types(static_cast<size_t>(vocab_size), 0);
  auto place = [&](int64_t id, const std::string& text, int32_t type) {
    if (id < 0 || id >= vocab_size)
      throw UnsupportedInput(where + ": token id " + std::to_string(id) + " (" + text + ") is outside the model's " +
                             std::to_string(vocab_size) + " embedding rows");
    tokens[static_cast<size_t>(id)] = text;
    types[static_cast<size_t>(id)] = type;
  };
  auto is_byte = [](const std::string& t) {
    return t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>' && std::isxdigit(static_cast<unsigned char>(t[3])) &&
           std::isxdigit(static_cast<unsigned char>(t[4]));
  };
  for (const auto& [text, id] : model.at("vocab").items())
    place(id.get<int64_t>(), text, space_prefix && is_byte(text) ? 6 : 1);
  const std::string unk = model.value("unk_token", json()).is_string() ? model["unk_token"].get<std::string>() : "";
  for (const auto& t : j.value("added_tokens", json::array())) {
    const std::string text = t.at("content").get<std::string>();
    const int32_t type = space_prefix && is_byte(text) ? 6 : text == unk ? 2 : t.value("special", false) ? 3 : 4;
    place(t.at("id").get<int64_t>(), text, type);
  }
  for (size_t i = 0; i < tokens.size(); ++i)
    if (types[i] == 0) tokens[i] = "[PAD" + std::to_string(i) + "]", types[i] = 5;  // UNUSED, as llama.cpp pads
  std::vector<std::string> merges;
  for (const auto& m : model.value("merges", json::array()))
    merges.push_back(m.is_string() ? m.get<std::string>()
                                   : m.at(0).get<std::string>() + " " + m.at(1).get<std::string>());

  w.add("tokenizer.ggml.model", std::string(space_prefix ? "llama" : "gpt2"));
  if (!pre.empty()) w.add("tokenizer.ggml.pre", pre);
  w.add("tokenizer.ggml.tokens", tokens);
  if (space_prefix) w.add("tokenizer.ggml.scores", merge_scores(tokens, merges));
  w.add("tokenizer.ggml.token_type", types);
  w.add("tokenizer.ggml.merges", merges);
  if (space_prefix) {
    w.add("tokenizer.ggml.add_space_prefix", *space_prefix);
    if (const auto u = std::find(tokens.begin(), tokens.end(), unk); !unk.empty() && u != tokens.end())
      w.add("tokenizer.ggml.unknown_token_id", static_cast<uint32_t>(u - tokens.begin()));
  }
  add_special_tokens(w, dir);
}

}  // namespace

GgmlType gguf_type_named(const std::string& name) {
  if (name == "f32") return GgmlType::f32;
  if (name == "f16") return GgmlType::f16;
  if (name == "bf16") return GgmlType::bf16;
  if (name == "q8_0") return GgmlType::q8_0;
  throw UsageError("--gguf-type '" + name + "': choose f32, f16, bf16 or q8_0");
}

void write_gguf(const std::string& model_dir, const std::string& tokenizer_dir, const std::string& out, GgmlType type) {
  const auto t0 = std::chrono::steady_clock::now();
  const LlamaShape s = read_hf_config(model_dir);
  const HfStorage storage = read_hf_storage(model_dir);
  refuse_unexpressible(s, storage, model_dir);
  const HfCheckpoint ckpt(model_dir, s.tie_embeddings);
  verify_hf_tensors(ckpt, s, storage, /*compare_values=*/false);
  const Arch arch = arch_of(s);
  GgufWriter w;
  add_model_metadata(w, s, arch, fs::path(model_dir).lexically_normal().filename().string(), type);
  add_tokenizer_metadata(w, tokenizer_dir, s.vocab_size);
  add_model_tensors(w, ckpt, s, type);
  auto fixed = [](double v, const char* unit) {
    char buf[64];
    std::snprintf(buf, sizeof buf, "%.2f %s", v, unit);
    return std::string(buf);
  };
  log::info("writing ", out, ": GGUF v3, architecture ", arch.name, ", ", w.tensor_count(), " tensors in ",
            ggml_type_name(type), " (norms, biases and RoPE factors F32), ",
            fixed(static_cast<double>(w.tensor_bytes()) / 1048576.0, "MiB"), " of tensor data");
  const uint64_t bytes = w.write(out, [&](size_t i, size_t n) {
    if (i == n || i % 64 == 0) log::info("  ", i, "/", n, " tensors written");
  });
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  log::info("wrote ", out, ": ", bytes, " bytes in ", fixed(secs, "s"));
}

int run_export_gguf(const std::string& checkpoint_dir, const std::string& config_path, const std::string& out,
                    const std::string& type_name) {
  const GgmlType type = gguf_type_named(type_name);
  if (checkpoint_dir.empty() == config_path.empty())
    throw UsageError(
        "export --gguf takes --checkpoint DIR (a training checkpoint) or --config FILE (its model.hf_path)");
  Environment env = Environment::detect();
  env.local = false;  // the run's data files need not be here
  if (!config_path.empty()) {
    const Config c = load_config(config_path, {}, env);
    if (!gguf_model_file(c.model.hf_path).empty())
      throw UsageError(config_path +
                       ": model.hf_path is a GGUF file already; train on it and export the checkpoint "
                       "(--checkpoint DIR)");
    if (c.model.hf_path.empty())
      throw UsageError(config_path +
                       ": model.hf_path is empty — a seeded init has no trained weights to export; "
                       "export a checkpoint (--checkpoint DIR)");
    if (!c.lora.adapter_path.empty())
      throw UsageError(config_path +
                       ": lora.adapter_path is set — export --gguf writes model.hf_path alone; to "
                       "merge adapters, export a checkpoint of a run that trained them (--checkpoint DIR)");
    write_gguf(c.model.hf_path, c.tokenizer_path(), out, type);
    return 0;
  }
  // A checkpoint: its Hugging Face export (adapters merged, as --merge does) beside `out`, then GGUF.
  const Config c = load_config((fs::path(checkpoint_dir) / "config.toml").string(), {}, env);
  const fs::path tmp =
      fs::path(out).parent_path() / (fs::path(out).filename().string() + ".hf.tmp." + std::to_string(::getpid()));
  struct Cleanup {
    fs::path p;
    ~Cleanup() {
      try {
        remove_tree(p.string());
      } catch (const std::exception& e) {
        log::warn("could not remove ", p.string(), ": ", e.what());
      }
    }
  } cleanup{tmp};
  run_export(checkpoint_dir, tmp.string(), /*merge=*/c.lora.enabled);
  write_gguf(tmp.string(), tmp.string(), out, type);
  return 0;
}

}  // namespace ptrain
