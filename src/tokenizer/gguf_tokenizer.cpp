#include "tokenizer/gguf_tokenizer.h"

#include <algorithm>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <unordered_map>
#include <vector>

#include "checkpoint/gguf_reader.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "tokenizer/byte_level.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The split regexes transformers' GGUF loader sets for a `tokenizer.ggml.pre` name it knows
// (GGUF_PRE_TOKENIZER_SPLITS); other names keep GPT-2's own (ByteLevel with its regex).
const char* kLlama3Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen2Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kQwen35Split =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kTekkenSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
const char* kGpt4oSplit =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

const char* split_of(const std::string& pre) {
  static const std::map<std::string, const char*> splits = {
      {"llama3", kLlama3Split},       {"llama-v3", kLlama3Split},
      {"llama-bpe", kLlama3Split},    {"falcon3", kLlama3Split},
      {"falcon-h1", kLlama3Split},    {"pixtral", kLlama3Split},
      {"midm-2.0", kLlama3Split},     {"lfm2", kLlama3Split},
      {"jina-v5-nano", kLlama3Split}, {"dbrx", kLlama3Split},
      {"smaug-bpe", kLlama3Split},    {"tekken", kTekkenSplit},
      {"qwen2", kQwen2Split},         {"deepseek-r1-qwen", kQwen2Split},
      {"kormo", kQwen2Split},         {"f2llmv2", kQwen2Split},
      {"megrez", kQwen2Split},        {"qwen35", kQwen35Split},
      {"gpt-4o", kGpt4oSplit},        {"llama4", kGpt4oSplit},
      {"kanana2", kGpt4oSplit},       {"talkie", kGpt4oSplit},
      {"minimax-m2", kGpt4oSplit},
  };
  auto it = splits.find(pre);
  return it == splits.end() ? nullptr : it->second;
}

// A token's characters (code points, as UTF-8 strings); nullopt when it is not valid UTF-8.
std::optional<std::vector<std::string>> characters(const std::string& s) {
  std::vector<std::string> out;
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 0;
    if (n == 0 || i + n > s.size()) return std::nullopt;
    for (size_t k = 1; k < n; ++k)
      if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return std::nullopt;
    out.push_back(s.substr(i, n));
    i += n;
  }
  return out;
}

bool in_byte_alphabet(const std::vector<std::string>& chars) {
  const auto& map = byte_level().byte_of;
  return std::all_of(chars.begin(), chars.end(), [&](const std::string& c) { return map.count(c) > 0; });
}

// The merges a vocabulary implies where the file lists none (transformers' generate_merges with
// scores): every split of every token into two vocabulary tokens, ordered by the token's score
// (highest first), then by the pieces' lengths (longest first) — stably, from the tokens' order
// and, within one token, the pieces' ids.
std::vector<std::pair<std::string, std::string>> merges_from_scores(
    const std::vector<std::string>& tokens, const std::vector<double>& scores,
    const std::unordered_map<std::string, int64_t>& vocab) {
  // dict(zip(tokens, scores)): first position, last score
  std::vector<std::string> order;
  std::unordered_map<std::string, double> score;
  for (size_t i = 0; i < tokens.size(); ++i) {
    if (!score.count(tokens[i])) order.push_back(tokens[i]);
    score[tokens[i]] = scores[i];
  }
  struct Merge {
    std::string left, right;
    double score;
    size_t left_chars, right_chars;
  };
  std::vector<Merge> merges;
  for (const auto& token : order) {
    const auto chars = characters(token);
    if (!chars) continue;  // refused earlier
    std::vector<Merge> local;
    std::string left;
    for (size_t k = 1; k < chars->size(); ++k) {
      left += (*chars)[k - 1];
      const std::string right = token.substr(left.size());
      if (vocab.count(left) && vocab.count(right)) local.push_back({left, right, score[token], k, chars->size() - k});
    }
    std::sort(local.begin(), local.end(), [&](const Merge& a, const Merge& b) {
      return std::make_pair(vocab.at(a.left), vocab.at(a.right)) < std::make_pair(vocab.at(b.left), vocab.at(b.right));
    });
    merges.insert(merges.end(), local.begin(), local.end());
  }
  std::stable_sort(merges.begin(), merges.end(), [](const Merge& a, const Merge& b) {
    return std::make_tuple(a.score, a.left_chars, a.right_chars) >
           std::make_tuple(b.score, b.left_chars, b.right_chars);
  });
  std::vector<std::pair<std::string, std::string>> out;
  out.reserve(merges.size());
  for (auto& m : merges) out.emplace_back(std::move(m.left), std::move(m.right));
  return out;
}

json added_token(const std::string& content, int64_t id, bool special) {
  return {{"id", id},        {"content", content},  {"single_word", false}, {"lstrip", false},
          {"rstrip", false}, {"normalized", false}, {"special", special}};
}

}  // namespace

std::string gguf_tokenizer_file(const std::string& path) {
  return gguf_file_at(path, "tokenizer.json", "data.tokenizer (or model.hf_path)");
}

void write_gguf_tokenizer_dir(const GgufTokenizer& t, const std::string& dir) {
  fs::create_directories(dir);
  json config = {{"tokenizer_class", "TokenizersBackend"},
                 {"backend", "tokenizers"},
                 {"add_bos_token", t.add_bos},
                 {"add_eos_token", t.add_eos}};
  for (const auto& [key, token] : {std::pair<const char*, const std::string&>{"bos_token", t.bos},
                                   {"eos_token", t.eos},
                                   {"unk_token", t.unk},
                                   {"pad_token", t.pad}})
    config[key] = token.empty() ? json(nullptr) : json(token);
  write_file_atomic((fs::path(dir) / "tokenizer.json").string(), t.tokenizer_json);
  write_file_atomic((fs::path(dir) / "tokenizer_config.json").string(), config.dump(2) + "\n");
  if (!t.chat_template.empty()) write_file_atomic((fs::path(dir) / "chat_template.jinja").string(), t.chat_template);
}

GgufTokenizer read_gguf_tokenizer(const std::string& path) {
  const GgufFile f(path);
  auto refuse = [&](const std::string& why) { throw UnsupportedInput(path + ": " + why); };
  const auto model = f.string("tokenizer.ggml.model");
  if (!model) refuse("no tokenizer.ggml.model: the file holds no tokenizer (set data.tokenizer to the model's)");
  const std::string arch = f.string("general.architecture").value_or("");
  if (*model != "gpt2" && *model != "llama")
    refuse("tokenizer.ggml.model \"" + *model +
           "\": ptrain reads the byte-level (gpt2) and SentencePiece-style BPE (llama) tokenizers of GGUF files");
  const bool byte_level_bpe = *model == "gpt2";
  if (!byte_level_bpe && (arch.starts_with("gemma") || arch == "phi3"))
    refuse("a SentencePiece vocabulary of architecture \"" + arch +
           "\", which transformers' GGUF loader rebuilds its own way: set data.tokenizer to the model's tokenizer");
  const auto* tokens = f.strings("tokenizer.ggml.tokens");
  if (!tokens || tokens->empty()) refuse("no tokenizer.ggml.tokens");
  const auto* types = f.integers("tokenizer.ggml.token_type");
  if (types && types->size() != tokens->size())
    refuse("tokenizer.ggml.token_type has " + std::to_string(types->size()) + " entries for " +
           std::to_string(tokens->size()) + " tokens");

  // The vocabulary: gpt2's spelled in the byte alphabet; a repeated token keeps its last id (a dict).
  std::vector<std::string> spelled(tokens->size());
  std::vector<bool> in_alphabet(tokens->size(), true);
  std::unordered_map<std::string, int64_t> raw_vocab, vocab;
  for (size_t i = 0; i < tokens->size(); ++i) {
    const std::string& t = (*tokens)[i];
    const auto chars = characters(t);
    if (!chars) refuse("tokenizer.ggml.tokens[" + std::to_string(i) + "] is not valid UTF-8");
    raw_vocab[t] = static_cast<int64_t>(i);
    spelled[i] = t;
    if (byte_level_bpe && !in_byte_alphabet(*chars)) {
      in_alphabet[i] = false;
      spelled[i].clear();
      for (unsigned char b : t) spelled[i] += byte_level().of_byte[b];
    }
    vocab[spelled[i]] = static_cast<int64_t>(i);
  }
  json vocab_json = json::object();
  for (size_t i = 0; i < spelled.size(); ++i)
    if (vocab.at(spelled[i]) == static_cast<int64_t>(i)) vocab_json[spelled[i]] = i;

  json merges = json::array();
  std::string merges_from = "the file's merges";
  if (const auto* m = f.strings("tokenizer.ggml.merges")) {
    for (size_t i = 0; i < m->size(); ++i) {
      const std::string& s = (*m)[i];
      const size_t sp = s.find(' ');
      if (sp == std::string::npos || s.find(' ', sp + 1) != std::string::npos)
        refuse("tokenizer.ggml.merges[" + std::to_string(i) + "] \"" + s + "\" is not two tokens split by one space");
      merges.push_back(json::array({s.substr(0, sp), s.substr(sp + 1)}));
    }
  } else {
    const auto* scores = f.numbers("tokenizer.ggml.scores");
    if (!scores || scores->size() != tokens->size())
      refuse("neither tokenizer.ggml.merges nor one tokenizer.ggml.scores entry per token: no merges to build");
    for (auto& [l, r] : merges_from_scores(*tokens, *scores, raw_vocab)) merges.push_back(json::array({l, r}));
    merges_from = "merges from the scores (the file lists none)";
  }

  json j = {{"version", "1.0"}, {"truncation", nullptr}, {"padding", nullptr}, {"normalizer", nullptr}};
  j["model"] = {{"type", "BPE"},
                {"dropout", nullptr},
                {"unk_token", nullptr},
                {"fuse_unk", !byte_level_bpe},
                {"byte_fallback", !byte_level_bpe},
                {"ignore_merges", false},
                {"vocab", vocab_json},
                {"merges", merges}};
  j["model"]["continuing_subword_prefix"] = byte_level_bpe ? json("") : json(nullptr);
  j["model"]["end_of_word_suffix"] = byte_level_bpe ? json("") : json(nullptr);
  const std::string pre = f.string("tokenizer.ggml.pre").value_or("");
  std::string split_note;
  if (byte_level_bpe) {
    const json byte_level_step = [](bool regex) {
      return json{{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true}, {"use_regex", regex}};
    }(split_of(pre) == nullptr);
    if (const char* split = split_of(pre)) {
      j["pre_tokenizer"] = {
          {"type", "Sequence"},
          {"pretokenizers",
           json::array(
               {{{"type", "Split"}, {"pattern", {{"Regex", split}}}, {"behavior", "Isolated"}, {"invert", false}},
                byte_level_step})}};
      split_note = "pre \"" + pre + "\"'s split";
    } else {
      j["pre_tokenizer"] = byte_level_step;
      split_note = "GPT-2's split (transformers knows no split for pre \"" + pre + "\")";
    }
    j["decoder"] = {{"type", "ByteLevel"}, {"add_prefix_space", true}, {"trim_offsets", true}, {"use_regex", true}};
  } else {
    j["pre_tokenizer"] = {
        {"type", "Metaspace"}, {"replacement", "\u2581"}, {"prepend_scheme", "first"}, {"split", false}};
    j["decoder"] = {
        {"type", "Sequence"},
        {"decoders", json::array({{{"type", "Replace"}, {"pattern", {{"String", "\u2581"}}}, {"content", " "}},
                                  {{"type", "ByteFallback"}},
                                  {{"type", "Fuse"}},
                                  {{"type", "Strip"}, {"content", " "}, {"start", 1}, {"stop", 0}}})}};
  }

  // Added tokens: control ones (type 3; a byte-level one spelled outside the alphabet is a
  // mislabel transformers skips), user-defined ones (type 4) found in the vocabulary as written,
  // then the named special tokens.
  std::map<int64_t, json> added;
  std::set<std::string> added_names;
  auto add = [&](const std::string& content, int64_t id, bool special) {
    if (added_names.count(content)) return;
    added_names.insert(content);
    added[id] = added_token(content, id, special);
  };
  if (types)
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string& t = (*tokens)[i];
      if ((*types)[i] == 3 && in_alphabet[i]) add(t, vocab.at(t), true);
    }
  if (types)
    for (size_t i = 0; i < tokens->size(); ++i) {
      const std::string& t = (*tokens)[i];
      if ((*types)[i] == 4 && vocab.count(t)) add(t, vocab.at(t), false);
    }
  auto named = [&](const char* key) -> std::string {
    const auto id = f.integer(std::string("tokenizer.ggml.") + key);
    if (!id) return "";
    if (*id < 0 || *id >= static_cast<int64_t>(tokens->size()))
      refuse(std::string("tokenizer.ggml.") + key + " = " + std::to_string(*id) + " is outside the " +
             std::to_string(tokens->size()) + " tokens");
    return (*tokens)[static_cast<size_t>(*id)];
  };
  const std::string bos = named("bos_token_id"), eos = named("eos_token_id"), unk = named("unknown_token_id"),
                    pad = named("padding_token_id");
  for (const std::string& t : {bos, eos, unk, pad}) {
    if (t.empty() || added_names.count(t)) continue;
    if (!vocab.count(t))
      refuse("special token \"" + t + "\" is not in the vocabulary as spelled: transformers would add it as a " +
             "new token past the model's vocabulary");
    add(t, vocab.at(t), true);
  }
  j["added_tokens"] = json::array();
  for (auto& [id, t] : added) j["added_tokens"].push_back(t);

  // The post-processor: BOS / EOS as add_bos_token / add_eos_token say (SentencePiece: BOS unless
  // the file says otherwise), where the token exists.
  const bool add_bos = f.boolean("tokenizer.ggml.add_bos_token").value_or(!byte_level_bpe) && !bos.empty();
  const bool add_eos = f.boolean("tokenizer.ggml.add_eos_token").value_or(false) && !eos.empty();
  auto special = [](const std::string& t, int type_id) {
    return json{{"SpecialToken", {{"id", t}, {"type_id", type_id}}}};
  };
  auto sequence = [](const char* id, int type_id) { return json{{"Sequence", {{"id", id}, {"type_id", type_id}}}}; };
  json single = json::array(), pair = json::array(), specials = json::object();
  for (int part = 0; part < 2; ++part) {
    json& out = part == 0 ? single : pair;
    for (int type_id = 0; type_id <= part; ++type_id) {
      if (add_bos) out.push_back(special(bos, type_id));
      out.push_back(sequence(type_id == 0 ? "A" : "B", type_id));
      if (add_eos) out.push_back(special(eos, type_id));
    }
  }
  for (const auto& [use, t] : {std::make_pair(add_bos, bos), std::make_pair(add_eos, eos)})
    if (use) specials[t] = {{"id", t}, {"ids", json::array({vocab.at(t)})}, {"tokens", json::array({t})}};
  j["post_processor"] = {
      {"type", "TemplateProcessing"}, {"single", single}, {"pair", pair}, {"special_tokens", specials}};

  GgufTokenizer out;
  out.tokenizer_json = j.dump();
  out.bos = bos;
  out.eos = eos;
  out.unk = unk;
  out.pad = pad;
  out.add_bos = add_bos;
  out.add_eos = add_eos;
  out.chat_template = f.string("tokenizer.chat_template").value_or("");
  out.header_bytes = f.header_bytes();
  out.description = "GGUF tokenizer.ggml.* as transformers' GGUF loader builds it (" +
                    std::string(byte_level_bpe ? "byte-level BPE, " + split_note : "SentencePiece-style BPE") + ", " +
                    merges_from + (add_bos ? ", BOS added" : "") + (add_eos ? ", EOS added" : "") + ")";
  return out;
}

const char* gguf_pre_tokenizer_split(const std::string& pre) { return split_of(pre); }

}  // namespace ptrain
