#include "tokenizer/tokenizer_dir.h"
#include <algorithm>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include "checkpoint/hf_config_file.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"

namespace ptrain {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

enum class TokClass { backend, llama, qwen2, gpt2 };

const char* name_of(TokClass c) {
  switch (c) {
    case TokClass::llama:
      return "LlamaTokenizer";
    case TokClass::qwen2:
      return "Qwen2Tokenizer";
    case TokClass::gpt2:
      return "GPT2Tokenizer";
    default:
      return "TokenizersBackend";
  }
}

// The tokenizer class transformers 5.23 registers for a model type (models/auto/tokenization_auto.py):
// none for llama, the file as written (TokenizersBackend) for mistral / mixtral, Qwen2Tokenizer for
// the Qwen families. qwen2 is one of the model types whose declared class transformers overrides.
struct ModelType {
  const char* name;
  std::optional<TokClass> registered;
  bool overrides_declared;
};
constexpr ModelType kModelTypes[] = {
    {"llama", std::nullopt, false},        {"mistral", TokClass::backend, false}, {"mixtral", TokClass::backend, false},
    {"qwen2", TokClass::qwen2, true},      {"qwen2_moe", TokClass::qwen2, false}, {"qwen3", TokClass::qwen2, false},
    {"qwen3_moe", TokClass::qwen2, false},
};

// tokenizer_config.json keys transformers 5.23's code reads for the classes ptrain implements
// (tests/fixtures/derive_hf_keys.py lists them from its source: every __init__ parameter along
// the class's MRO and every key __init__ / _from_pretrained take from their kwargs;
// tests/fixtures/hf_keys_read.json; HfKeys.TokenizerTablesNameEveryKeyTransformersReads checks
// this table names each). Every other key is ignored, as transformers ignores it, and listed.
//
// Keys read that change nothing transformers' encode(text) or decode(ids) gives with a
// tokenizer.json present: loader and provenance flags, batch cutting and padding (ptrain cuts and
// pads samples itself), the chat template (read by tokenizer/chat.h), files tokenizer.json
// replaces, and arguments transformers itself fills in. (add_bos_token / add_eos_token are
// dropped then: the tokenizer.json post-processor decides; clean_up_tokenization_spaces is
// skipped for BPE; errors is the slow tokenizer's.)
const std::set<std::string> kNoEffectKeys{
    "_commit_hash",
    "_json_padding",
    "_json_truncation",
    "_spm_precompiled_charsmap",
    "add_bos_token",
    "add_eos_token",
    "backend",
    "chat_control_tokens",
    "chat_template",
    "clean_up_tokenization_spaces",
    "errors",
    "files_loaded",
    "gguf_file",
    "init_inputs",
    "is_local",
    "local_files_only",
    "max_len",
    "merges",
    "merges_file",
    "model_input_names",
    "model_max_length",
    "model_specific_special_tokens",
    "name_or_path",
    "padding_side",
    "post_processor",
    "processor_class",
    "response_schema",
    "response_template",
    "tokenizer_file",
    "tokenizer_padding",
    "tokenizer_truncation",
    "truncation_side",
    "unk_id",
    "use_default_system_prompt",
    "verbose",
    "vocab",
    "vocab_file",
};
// Keys read that change the ids or the text, and how ptrain treats each: implemented below, or
// refused at values it does not reproduce.
const std::set<std::string> kEffectKeys{
    "tokenizer_class",   // the class, which may rebuild the pipeline
    "legacy",            // LlamaTokenizer's prepend scheme
    "add_prefix_space",  // LlamaTokenizer's prepend scheme; Qwen2Tokenizer / GPT2Tokenizer: refused when true
    "added_tokens_decoder",
    "additional_special_tokens",
    "extra_special_tokens",
    "split_special_tokens",                                                     // refused unless false
    "fix_mistral_regex",                                                        // refused unless false
    "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output",  // refused unless false
    "auto_map",                                                                 // refused: remote code
    "fast_tokenizer_files",  // which tokenizer file is read (hf_tokenizer_file)
    "tokenizer",             // refused: a tokenizer object in place of tokenizer.json
    "tokenizer_object",      // refused: the same
};
const char* const kNamedSpecial[] = {"bos_token", "eos_token", "unk_token", "pad_token",
                                     "sep_token", "cls_token", "mask_token"};

struct Reader {
  fs::path cfg_path;
  json cfg = json::object();  // tokenizer_config.json ({} when absent)
  json& tok;

  std::map<std::string, fs::path> origin;  // keys special_tokens_map.json set

  [[noreturn]] void fail(const std::string& key, const std::string& what) const {
    const auto o = origin.find(key.substr(0, key.find_first_of(" .[")));
    throw RuntimeError((o == origin.end() ? cfg_path : o->second).string() + ": " + key + ": " + what);
  }

  const json* get(const char* key) const {
    auto it = cfg.find(key);
    return it == cfg.end() ? nullptr : &*it;
  }
  // A bool option, `fallback` when absent; null is Python's None (falsy).
  bool flag(const char* key, bool fallback) const {
    const json* v = get(key);
    if (!v) return fallback;
    if (v->is_null()) return false;
    if (!v->is_boolean()) fail(key, "must be true, false or null, not " + v->dump());
    return v->get<bool>();
  }

  // tokenizer.json's added token with this content, or null.
  const json* added(const std::string& content) const {
    const auto list = tok.find("added_tokens");
    if (list == tok.end() || !list->is_array()) return nullptr;
    for (const auto& a : *list)
      if (a.is_object() && a.value("content", "") == content) return &a;
    return nullptr;
  }

  // Whether transformers swaps a named special token (bos_token ... mask_token) for the added token
  // of that content it already holds: added_tokens_decoder's, or without one tokenizer.json's
  // added tokens. The token then keeps that entry's flags, not the ones it is named with.
  bool held(const std::string& content) const {
    const json* d = get("added_tokens_decoder");
    if (!d) return added(content) != nullptr;
    if (!d->is_object()) return false;
    for (const auto& [id, entry] : d->items())
      if (entry.is_object() && entry.value("content", "") == content) return true;
    return false;
  }

  // A special token the files name must be an added token of tokenizer.json (transformers would add
  // it as a new one, which ptrain does not); named as an AddedToken object that transformers does
  // not swap for an entry it holds (`named`: a key of kNamedSpecial), with its flags.
  void check_named(const std::string& key, const json& v, bool named = false) const {
    if (v.is_null()) return;
    std::string content;
    json want = {{"special", true}, {"lstrip", false}, {"rstrip", false}, {"normalized", false}};
    if (v.is_string()) {
      content = v.get<std::string>();
    } else if (v.is_object() && v.value("__type", "") == "AddedToken" && v.contains("content") &&
               v["content"].is_string()) {
      content = v["content"].get<std::string>();
      want["special"] = v.contains("special") ? v["special"] : json(true);
      for (const char* f : {"lstrip", "rstrip"}) want[f] = v.contains(f) ? v[f] : json(false);
      want["normalized"] = v.contains("normalized") ? v["normalized"] : json(!want["special"].get<bool>());
    } else {
      fail(key, "must be a token string, an AddedToken object or null, not " + v.dump());
    }
    const json* a = added(content);
    if (!a)
      fail(key, "'" + content +
                    "' is not an added token of tokenizer.json; transformers adds it as a new special token, which "
                    "ptrain does not (add it to tokenizer.json's added_tokens, e.g. by saving the tokenizer with "
                    "transformers)");
    // A token named as a string that tokenizer.json already holds is not re-added: transformers
    // keeps tokenizer.json's flags for it (a Mistral tokenizer converted by transformers names its
    // 770 control tokens in extra_special_tokens, some of them special = false in tokenizer.json).
    if (v.is_string() || (named && held(content))) return;
    for (const auto& [f, value] : want.items())
      if (a->value(f, json(false)) != value)
        fail(key, "'" + content + "' has " + f + " = " + a->value(f, json(false)).dump() +
                      " in tokenizer.json; transformers re-adds it with " + f + " = " + value.dump() +
                      ", which ptrain does not (make them agree)");
  }

  // added_tokens.json (legacy, read by transformers only without added_tokens_decoder): each
  // token is re-added as special when a special token is named so, else as a normalized plain one.
  void check_added_tokens_file(const fs::path& path, const json& file) const {
    if (!file.is_object()) throw RuntimeError(path.string() + ": not a JSON object of token: id");
    std::set<std::string> special;
    for (const char* key : kNamedSpecial)
      if (const json* v = get(key); v && v->is_string()) special.insert(v->get<std::string>());
    for (const char* key : {"additional_special_tokens", "extra_special_tokens"})
      if (const json* v = get(key); v && v->is_array())
        for (const auto& t : *v)
          if (t.is_string()) special.insert(t.get<std::string>());
    for (const auto& [content, id] : file.items()) {
      const json* a = added(content);
      if (!a || a->value("id", json()) != id)
        throw RuntimeError(path.string() + ": '" + content + "' = " + id.dump() +
                           " is not an added token of tokenizer.json with that id; transformers adds it, which ptrain "
                           "does not");
      const bool is_special = special.count(content) > 0;
      if (a->value("special", false) != is_special || a->value("normalized", false) == is_special ||
          a->value("lstrip", false) || a->value("rstrip", false))
        throw RuntimeError(path.string() + ": '" + content + "': transformers re-adds it " +
                           (is_special ? "as a special token" : "as a plain, normalized token") +
                           " without lstrip / rstrip, which tokenizer.json's flags for it are not");
    }
  }

  void check_special_tokens(TokClass cls) const {
    for (const char* key : kNamedSpecial) {
      if (const json* v = get(key)) {
        check_named(key, *v, true);
        continue;
      }
      // The class's own defaults when the key is absent.
      if (cls == TokClass::llama &&
          (std::string(key) == "unk_token" || std::string(key) == "bos_token" || std::string(key) == "eos_token"))
        check_named(key + std::string(" (LlamaTokenizer's default)"), key == std::string("unk_token")   ? "<unk>"
                                                                      : key == std::string("bos_token") ? "<s>"
                                                                                                        : "</s>");
      if (cls == TokClass::qwen2 &&
          (std::string(key) == "unk_token" || std::string(key) == "eos_token" || std::string(key) == "pad_token"))
        check_named(key + std::string(" (Qwen2Tokenizer's default)"), "<|endoftext|>");
      if (cls == TokClass::gpt2 &&
          (std::string(key) == "unk_token" || std::string(key) == "bos_token" || std::string(key) == "eos_token"))
        check_named(key + std::string(" (GPT2Tokenizer's default)"), "<|endoftext|>");
    }
    for (const char* key : {"additional_special_tokens", "extra_special_tokens"}) {
      const json* v = get(key);
      if (!v || v->is_null()) continue;
      if (v->is_array()) {
        for (const auto& t : *v) check_named(key, t);
      } else if (v->is_object()) {
        for (const auto& [name, t] : v->items()) check_named(std::string(key) + "." + name, t);
      } else {
        fail(key, "must be a list of tokens, not " + v->dump());
      }
    }
  }

  // A byte-level class's add_prefix_space = true puts a space before every text, which ptrain
  // does not.
  void refuse_prefix_space(const char* cls) const {
    if (get("add_prefix_space") && flag("add_prefix_space", false))
      fail("add_prefix_space",
           std::string("= true: ") + cls + " then puts a space before every text, which ptrain does not");
  }

  // added_tokens_decoder: transformers adds every entry that differs from tokenizer.json's.
  void check_added_tokens_decoder() const {
    const json* d = get("added_tokens_decoder");
    if (!d || d->is_null()) return;
    if (!d->is_object()) fail("added_tokens_decoder", "must be an object of id: token");
    for (const auto& [id, entry] : d->items()) {
      const std::string key = "added_tokens_decoder[" + id + "]";
      if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
        fail(key, "must be an object with a string content");
      const std::string content = entry["content"].get<std::string>();
      const json* a = added(content);
      if (!a)
        fail(key, "'" + content +
                      "' is not an added token of tokenizer.json; transformers adds it as a new token, which ptrain "
                      "does not (add it to tokenizer.json's added_tokens)");
      if (a->value("id", json()).dump() != id)
        fail(key, "'" + content + "' has id " + a->value("id", json()).dump() + " in tokenizer.json");
      for (const char* f : {"lstrip", "rstrip", "normalized", "special", "single_word"})
        if (entry.contains(f) && entry[f] != a->value(f, json(false)))
          fail(key, "'" + content + "' has " + f + " = " + entry[f].dump() + " here but " +
                        a->value(f, json(false)).dump() +
                        " in tokenizer.json; transformers uses this file's, ptrain reads only tokenizer.json's (make "
                        "them agree)");
    }
  }
};

// The BPE options a class that rebuilds the pipeline sets (tokenizer.json's vocabulary, merges,
// added tokens and post-processor are kept): no unknown token, dropout or ignore_merges; unknown-
// token fusing and byte fallback as the class says.
void rebuild_bpe(json& model, bool fuse_unk, bool byte_fallback) {
  model["unk_token"] = nullptr;
  model["fuse_unk"] = fuse_unk;
  model["byte_fallback"] = byte_fallback;
  model["ignore_merges"] = false;
  model["dropout"] = nullptr;
}

// The decoder Qwen2Tokenizer and GPT2Tokenizer build (decoders.ByteLevel()'s defaults).
const json kByteLevelDecoder = {
    {"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};

std::string strip_fast(std::string s) {
  if (s.size() > 4 && s.ends_with("Fast")) s.resize(s.size() - 4);
  return s;
}

// special_tokens_map.json (a legacy file) merged into tokenizer_config.json as transformers
// merges it: its tokens over tokenizer_config's.
void merge_special_tokens_map(Reader& r, const fs::path& map_path) {
  if (!fs::exists(map_path)) return;
  const json m = read_json_file(map_path.string());
  if (!m.is_object()) throw RuntimeError(map_path.string() + ": not a JSON object");
  for (const auto& [key, value] : m.items()) {
    r.origin[key] = map_path;
    if (value.is_object() && key != "extra_special_tokens") {
      json token = value;
      token.erase("special");
      token["__type"] = "AddedToken";
      token["special"] = true;
      r.cfg[key] = token;
    } else if (key == "extra_special_tokens" && value.is_array() && r.cfg.contains(key) && r.cfg[key].is_array()) {
      for (const auto& t : value) r.cfg[key].push_back(t.is_object() ? t.value("content", json()) : t);
    } else {
      r.cfg[key] = value;
    }
  }
}

// config.json's model_type and tokenizer_class ("" where absent).
struct ModelConfigNames {
  fs::path path;
  std::string model_type, tokenizer_class;
};
ModelConfigNames read_model_config_names(const fs::path& dir) {
  ModelConfigNames n{hf_config_file(dir.string()), "", ""};
  if (!fs::exists(n.path)) return n;
  const json c = read_json_file(n.path.string());
  if (!c.is_object()) throw RuntimeError(n.path.string() + ": not a JSON object");
  if (c.contains("model_type") && c["model_type"].is_string()) n.model_type = c["model_type"].get<std::string>();
  if (c.contains("tokenizer_class") && c["tokenizer_class"].is_string())
    n.tokenizer_class = c["tokenizer_class"].get<std::string>();
  return n;
}

// Refuses the keys ptrain does not reproduce; returns those transformers does not read (ignored).
std::vector<std::string> check_config_keys(const Reader& r) {
  std::vector<std::string> ignored;
  for (const auto& [key, v] : r.cfg.items()) {
    if (key == "auto_map")
      r.fail(key, "names tokenizer code of the model's own (remote code), which ptrain cannot run");
    if (key == "tokenizer" || key == "tokenizer_object")
      r.fail(key, "hands transformers a tokenizer object instead of tokenizer.json; ptrain reads tokenizer.json");
    if (key == "split_special_tokens" && v != json(false) && !v.is_null())
      r.fail(key, "= " + v.dump() +
                      ": transformers then reads special tokens written in text as plain text, which ptrain "
                      "does not (set it to false)");
    if (key == "fix_mistral_regex" && v != json(false) && !v.is_null())
      r.fail(key, "= " + v.dump() + " replaces the split regex in transformers; ptrain does not (set it to false)");
    if (key == "clean_up_tokenization_spaces_for_bpe_even_though_it_will_corrupt_output" && v != json(false) &&
        !v.is_null())
      r.fail(key, "= " + v.dump() + " rewrites decoded text in transformers; ptrain does not (set it to false)");
    const bool named = std::find(std::begin(kNamedSpecial), std::end(kNamedSpecial), key) != std::end(kNamedSpecial);
    if (!kNoEffectKeys.count(key) && !kEffectKeys.count(key) && !named) ignored.push_back(key);
  }
  return ignored;
}

// The class AutoTokenizer resolves (transformers 5.23, a local directory without remote code),
// and why.
std::pair<TokClass, std::string> resolve_class(const Reader& r, const ModelConfigNames& config,
                                               const std::string& tokenizer_text) {
  std::string declared = config.tokenizer_class;
  if (const json* v = r.get("tokenizer_class"); v && !v->is_null()) {
    if (!v->is_string()) r.fail("tokenizer_class", "must be a string");
    declared = v->get<std::string>();
  }
  std::optional<TokClass> declared_class;
  if (!declared.empty()) {
    const std::string d = strip_fast(declared);
    if (d == "LlamaTokenizer")
      declared_class = TokClass::llama;
    else if (d == "Qwen2Tokenizer")
      declared_class = TokClass::qwen2;
    else if (d == "GPT2Tokenizer")
      declared_class = TokClass::gpt2;
    else if (d == "PreTrainedTokenizer" || d == "TokenizersBackend")
      declared_class = TokClass::backend;
    else
      throw RuntimeError((r.get("tokenizer_class") ? r.cfg_path : config.path).string() + ": tokenizer_class '" +
                         declared +
                         "' is not one ptrain reads (PreTrainedTokenizerFast / TokenizersBackend: tokenizer.json as "
                         "written; LlamaTokenizer; Qwen2Tokenizer; GPT2Tokenizer)");
  }
  const std::string& model_type = config.model_type;
  const ModelType* mt = nullptr;
  if (!model_type.empty()) {
    for (const auto& m : kModelTypes)
      if (model_type == m.name) mt = &m;
    if (!mt)
      throw RuntimeError(config.path.string() + ": model_type '" + model_type +
                         "': ptrain knows which tokenizer class transformers picks for llama, mistral, mixtral, qwen2, "
                         "qwen2_moe, qwen3 and qwen3_moe only");
  }
  if (declared_class == TokClass::llama && !(mt && mt->overrides_declared) &&
      tokenizer_text.find("\"ByteLevel\"") != std::string::npos)
    // transformers' rule: a byte-level tokenizer.json is never rebuilt as Llama's
    return {TokClass::backend, "tokenizer_class " + declared + " with a byte-level tokenizer.json"};
  if (declared_class && mt && mt->registered && *mt->registered != *declared_class) {
    const TokClass cls = *mt->registered == TokClass::backend ? TokClass::backend
                         : mt->overrides_declared             ? *mt->registered
                                                              : *declared_class;
    return {cls, "tokenizer_class " + declared + " and model_type " + model_type};
  }
  if (declared_class) return {*declared_class, "tokenizer_class " + declared};
  if (mt && mt->registered) return {*mt->registered, "model_type " + model_type};
  return {TokClass::backend, "no tokenizer_class"};
}

// The pipeline the class builds in place of tokenizer.json's (its vocabulary, merges, added
// tokens and post-processor are kept); returns what was rebuilt ("" for the file as written).
std::string rebuild_pipeline(const Reader& r, TokClass cls, json& tokenizer) {
  json& model = tokenizer["model"];
  if (cls == TokClass::llama) {
    const bool prefix =
        r.get("add_prefix_space") && !r.get("add_prefix_space")->is_null() ? r.flag("add_prefix_space", true) : true;
    const bool legacy = r.flag("legacy", false);
    const std::string scheme = !prefix ? "never" : legacy ? "always" : "first";
    tokenizer["normalizer"] = nullptr;
    tokenizer["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", "\xE2\x96\x81"}, {"prepend_scheme", scheme}, {"split", false}};
    json steps = json::array({{{"type", "Replace"}, {"pattern", {{"String", "\xE2\x96\x81"}}}, {"content", " "}},
                              {{"type", "ByteFallback"}},
                              {{"type", "Fuse"}}});
    if (prefix) steps.push_back({{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}});
    tokenizer["decoder"] = {{"type", "Sequence"}, {"decoders", steps}};
    rebuild_bpe(model, /*fuse_unk=*/true, /*byte_fallback=*/true);
    return ": pipeline rebuilt as LlamaTokenizer's (Metaspace, prepend scheme '" + scheme + "', no normalizer)";
  }
  if (cls == TokClass::qwen2) {
    r.refuse_prefix_space("Qwen2Tokenizer");
    tokenizer["normalizer"] = {{"type", "NFC"}};
    tokenizer["pre_tokenizer"] = {
        {"type", "Sequence"},
        {"pretokenizers",
         json::array(
             {{{"type", "Split"},
               {"pattern",
                {{"Regex",
                  R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"}}},
               {"behavior", "Isolated"},
               {"invert", false}},
              {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", false}}})}};
    tokenizer["decoder"] = kByteLevelDecoder;
    rebuild_bpe(model, /*fuse_unk=*/false, /*byte_fallback=*/false);
    return ": pipeline rebuilt as Qwen2Tokenizer's (NFC, Qwen's split regex, ByteLevel)";
  }
  if (cls == TokClass::gpt2) {
    // GPT2Tokenizer.__init__: BPE without dropout, affixes or unk fusing; byte-level with GPT-2's
    // regex; no normalizer.
    r.refuse_prefix_space("GPT2Tokenizer");
    tokenizer["normalizer"] = nullptr;
    tokenizer["pre_tokenizer"] = {
        {"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", true}};
    tokenizer["decoder"] = kByteLevelDecoder;
    rebuild_bpe(model, /*fuse_unk=*/false, /*byte_fallback=*/false);
    return ": pipeline rebuilt as GPT2Tokenizer's (ByteLevel with GPT-2's split regex, no normalizer)";
  }
  return "";
}

// bos_token / eos_token: the files' (special_tokens_map.json's over tokenizer_config.json's, as
// merged), else the class's default.
std::string special_token(const Reader& r, TokClass cls, const char* key, const char* llama_default,
                          const char* qwen_default) {
  if (const json* v = r.get(key)) {
    if (v->is_string()) return v->get<std::string>();
    if (v->is_object()) return v->value("content", "");
    return "";  // null
  }
  if (cls == TokClass::gpt2) return "<|endoftext|>";
  return cls == TokClass::llama ? llama_default : cls == TokClass::qwen2 ? qwen_default : "";
}

// What the reading leaves out, for the log: tokenizer.json's truncation / padding make HF cut and
// pad every encoding; ptrain does not (it cuts samples at data.seq_len + 1 ids and pads rows
// itself); and the tokenizer_config.json keys transformers does not read.
std::string left_out(const json& tokenizer, const std::vector<std::string>& ignored) {
  std::string note;
  for (const char* key : {"truncation", "padding"})
    if (tokenizer.contains(key) && !tokenizer[key].is_null())
      note += std::string("; tokenizer.json's ") + key +
              (tokenizer[key].is_object() && tokenizer[key].contains("max_length")
                   ? " (max_length " + tokenizer[key]["max_length"].dump() + ")"
                   : "") +
              " is not applied (ptrain cuts and pads samples itself: data.seq_len, data.truncation)";
  if (!ignored.empty()) {
    note += "; tokenizer_config.json keys transformers does not read, ignored:";
    for (const auto& key : ignored) note += " " + key;
  }
  return note;
}

TokenizerDirReading read_dir(const fs::path& dir, const fs::path& tokenizer_file, const std::string& tokenizer_text,
                             json& tokenizer) {
  Reader r{dir / "tokenizer_config.json", json::object(), tokenizer, {}};
  if (fs::exists(r.cfg_path)) {
    r.cfg = read_json_file(r.cfg_path.string());
    if (!r.cfg.is_object()) throw RuntimeError(r.cfg_path.string() + ": not a JSON object");
  }
  // The legacy files, read by transformers only when tokenizer_config.json has no added_tokens_decoder.
  const fs::path added_path = dir / "added_tokens.json";
  const bool legacy_files = !r.cfg.contains("added_tokens_decoder");
  if (legacy_files) merge_special_tokens_map(r, dir / "special_tokens_map.json");
  const std::vector<std::string> ignored = check_config_keys(r);
  auto [cls, why] = resolve_class(r, read_model_config_names(dir), tokenizer_text);
  r.check_added_tokens_decoder();
  r.check_special_tokens(cls);
  if (legacy_files && fs::exists(added_path))
    r.check_added_tokens_file(added_path, read_json_file(added_path.string()));
  if (const fs::path read = tokenizer_file.lexically_relative(dir); read != "tokenizer.json")
    why += "; " + read.string() + " read for tokenizer.json (fast_tokenizer_files)";
  why += rebuild_pipeline(r, cls, tokenizer);
  why += left_out(tokenizer, ignored);
  // Mistral's releases ship their Tekken vocabulary beside tokenizer.json. transformers reads
  // tokenizer.json unless mistral-common is installed; then it tokenizes with tekken.json through
  // MistralCommonBackend, which reads no special token written in a text.
  if (fs::exists(dir / "tekken.json"))
    why +=
        "; tekken.json not read: tokenizer.json is, as by transformers without mistral-common installed (with it, "
        "transformers tokenizes with tekken.json and reads no special token written in a text)";
  return {std::string(name_of(cls)) + " (" + why + ")", special_token(r, cls, "bos_token", "<s>", ""),
          special_token(r, cls, "eos_token", "</s>", "<|endoftext|>")};
}

}  // namespace

std::vector<std::string> tokenizer_config_keys_read() {
  std::vector<std::string> keys(kNoEffectKeys.begin(), kNoEffectKeys.end());
  keys.insert(keys.end(), kEffectKeys.begin(), kEffectKeys.end());
  keys.insert(keys.end(), std::begin(kNamedSpecial), std::end(kNamedSpecial));
  return keys;
}

TokenizerDirReading read_tokenizer_dir(const fs::path& dir, const fs::path& tokenizer_file,
                                       const std::string& tokenizer_text, json& tokenizer) {
  if (!tokenizer.is_object() || !tokenizer.contains("model") || !tokenizer["model"].is_object())
    return {"TokenizersBackend", "", ""};  // not a tokenizer.json: the reader names what is wrong with it
  try {
    return read_dir(dir, tokenizer_file, tokenizer_text, tokenizer);
  } catch (const json::exception& e) {
    throw RuntimeError(dir.string() + ": tokenizer_config.json or tokenizer.json holds a value of the wrong type (" +
                       e.what() + ")");
  }
}

}  // namespace ptrain
