#include "tokenizer/tokenizer_shape.h"

#include <map>
#include <vector>

#include "common/utf8.h"

namespace ptrain {

using nlohmann::json;

namespace {

using Fail = std::function<void(const std::string&)>;

enum class Type {
  boolean,
  string,
  character,  // a string of one Unicode character (Rust's char)
  count,      // a non-negative integer below 2^32
  number,
  pattern,  // {"String": s} or {"Regex": r}
  list,
  object,
  any,
};
// required: HF refuses the file without it; optional: absent means the default, null is refused;
// nullable: absent or null means the default.
enum class Need { required, optional, nullable };

struct Option {
  const char* name;
  Type type;
  Need need;
};
using Options = std::vector<Option>;

bool has_type(const json& v, Type t) {
  switch (t) {
    case Type::boolean:
      return v.is_boolean();
    case Type::string:
      return v.is_string();
    case Type::character:
      return v.is_string() && code_points(v.get_ref<const std::string&>()) == 1;
    case Type::count:
      return v.is_number_unsigned()
                 ? v.get<uint64_t>() <= 0xFFFFFFFFull
                 : v.is_number_integer() && v.get<int64_t>() >= 0 && v.get<int64_t>() <= 0xFFFFFFFFll;
    case Type::number:
      return v.is_number();
    case Type::pattern:
      return v.is_object() && v.size() == 1 && (v.contains("String") || v.contains("Regex")) && v.begin()->is_string();
    case Type::list:
      return v.is_array();
    case Type::object:
      return v.is_object();
    case Type::any:
      return true;
  }
  return false;
}

const char* type_name(Type t) {
  switch (t) {
    case Type::boolean:
      return "true or false";
    case Type::string:
      return "a string";
    case Type::character:
      return "a string of one character";
    case Type::count:
      return "a non-negative integer";
    case Type::number:
      return "a number";
    case Type::pattern:
      return "{\"String\": ...} or {\"Regex\": ...}";
    case Type::list:
      return "a list";
    case Type::object:
      return "an object";
    case Type::any:
      return "anything";
  }
  return "";
}

// `obj` (at `where`) holds exactly `options` (and "type"), each of its type, the required ones.
void check(const json& obj, const std::string& where, Options options, const Fail& fail) {
  if (!obj.is_object()) fail(where + " must be an object, not " + obj.dump().substr(0, 60));
  for (const auto& [key, value] : obj.items()) {
    if (key == "type") continue;  // the dispatch: checked by whoever chose these options
    const Option* o = nullptr;
    for (const auto& candidate : options)
      if (key == candidate.name) o = &candidate;
    if (!o) {
      std::string known;
      for (const auto& candidate : options) known += std::string(known.empty() ? "" : ", ") + candidate.name;
      fail(where + ": option '" + key + "' is not one ptrain reads (" + (known.empty() ? "it takes none" : known) +
           "); it is refused rather than ignored");
    }
    if (value.is_null()) {
      if (o->need != Need::nullable) fail(where + ": '" + key + "' is null, which HF tokenizers refuses");
    } else if (!has_type(value, o->type)) {
      fail(where + ": '" + key + "' must be " + type_name(o->type) + ", not " + value.dump().substr(0, 60));
    }
  }
  for (const auto& o : options)
    if (o.need == Need::required && !obj.contains(o.name))
      fail(where + ": '" + o.name + "' is missing (HF tokenizers refuses the file without it)");
}

std::string type_of(const json& node) {
  if (!node.is_object()) return "";
  auto t = node.find("type");
  return t != node.end() && t->is_string() ? t->get<std::string>() : "";
}

// The options of each kind of component ptrain implements, by slot; other kinds are refused by
// the reader, naming them.
const std::map<std::string, std::map<std::string, Options>>& component_options() {
  static const Options byte_level = {{"add_prefix_space", Type::boolean, Need::required},
                                     {"trim_offsets", Type::boolean, Need::required},
                                     {"use_regex", Type::boolean, Need::optional}};
  static const Options metaspace = {{"replacement", Type::character, Need::required},
                                    {"prepend_scheme", Type::string, Need::optional},
                                    {"split", Type::boolean, Need::nullable},
                                    {"add_prefix_space", Type::boolean, Need::optional},  // before prepend_scheme
                                    {"str_rep", Type::string, Need::optional}};           // older files: unused
  static const Options replace = {{"pattern", Type::pattern, Need::required},
                                  {"content", Type::string, Need::required}};
  static const std::map<std::string, std::map<std::string, Options>> all = {
      {"normalizer",
       {{"NFC", {}},
        {"NFD", {}},
        {"NFKC", {}},
        {"NFKD", {}},
        {"Lowercase", {}},
        {"Prepend", {{"prepend", Type::string, Need::required}}},
        {"Replace", replace},
        {"Sequence", {{"normalizers", Type::list, Need::required}}}}},
      {"pre_tokenizer",
       {{"Split",
         {{"pattern", Type::pattern, Need::required},
          {"behavior", Type::string, Need::required},
          {"invert", Type::boolean, Need::required}}},
        {"ByteLevel", byte_level},
        {"Metaspace", metaspace},
        {"Sequence", {{"pretokenizers", Type::list, Need::required}}}}},
      {"decoder",
       {{"ByteLevel", byte_level},
        {"Metaspace", metaspace},
        {"Replace", replace},
        {"ByteFallback", {}},
        {"Fuse", {}},
        {"Strip",
         {{"content", Type::character, Need::required},
          {"start", Type::count, Need::required},
          {"stop", Type::count, Need::required}}},
        {"Sequence", {{"decoders", Type::list, Need::required}}}}},
      {"post_processor",
       {{"ByteLevel", byte_level},
        {"TemplateProcessing",
         {{"single", Type::list, Need::required},
          {"pair", Type::list, Need::required},
          {"special_tokens", Type::object, Need::required}}},
        {"Sequence", {{"processors", Type::list, Need::required}}}}},
  };
  return all;
}

const std::map<std::string, std::string> kSequenceKey = {{"normalizer", "normalizers"},
                                                         {"pre_tokenizer", "pretokenizers"},
                                                         {"decoder", "decoders"},
                                                         {"post_processor", "processors"}};

// A TemplateProcessing's pieces and special tokens.
void check_template(const json& tp, const std::string& where, const Fail& fail) {
  for (const char* list : {"single", "pair"}) {
    const json& pieces = tp.at(list);
    for (size_t i = 0; i < pieces.size(); ++i) {
      const std::string at = where + "." + list + "[" + std::to_string(i) + "]";
      const json& piece = pieces[i];
      if (!piece.is_object() || piece.size() != 1 || !(piece.contains("SpecialToken") || piece.contains("Sequence")))
        fail(at + " must be {\"SpecialToken\": ...} or {\"Sequence\": ...}, not " + piece.dump().substr(0, 60));
      const bool special = piece.contains("SpecialToken");
      const json& body = piece.begin().value();
      check(body, at, {{"id", Type::string, Need::required}, {"type_id", Type::count, Need::required}}, fail);
      // (HF 0.23 panics on a single template holding $B.)
      if (!special && body.at("id") != "A" && (body.at("id") != "B" || std::string(list) == "single"))
        fail(at + ": the sequence " + body.at("id").dump() + " is not one the template can hold there");
      if (special && !tp.at("special_tokens").contains(body.at("id").get<std::string>()))
        fail(at + ": special token " + body.at("id").dump() + " is not in special_tokens");
    }
  }
  for (const auto& [name, token] : tp.at("special_tokens").items()) {
    const std::string at = where + ".special_tokens[\"" + name + "\"]";
    check(token, at,
          {{"id", Type::string, Need::required},
           {"ids", Type::list, Need::required},
           {"tokens", Type::list, Need::required}},
          fail);
    for (const auto& id : token.at("ids"))
      if (!has_type(id, Type::count)) fail(at + ": id " + id.dump() + " is not a non-negative integer");
    for (const auto& t : token.at("tokens"))
      if (!t.is_string()) fail(at + ": token " + t.dump() + " is not a string");
    if (token.at("ids").size() != token.at("tokens").size())
      fail(at + ": " + std::to_string(token.at("ids").size()) + " ids for " +
           std::to_string(token.at("tokens").size()) + " tokens");
  }
}

void check_component(const json& node, const std::string& slot, const std::string& where, const Fail& fail) {
  if (!node.is_object()) fail(where + " must be an object, not " + node.dump().substr(0, 60));
  const std::string type = type_of(node);
  if (!node.contains("type") || type.empty())
    fail(where + ": 'type' must be a non-empty string, not " +
         (node.contains("type") ? node.at("type").dump() : "absent"));
  const auto& kinds = component_options().at(slot);
  auto kind = kinds.find(type);
  if (kind == kinds.end()) return;  // a kind ptrain does not implement: the reader names it
  const std::string here = where + " (" + type + ")";
  check(node, here, kind->second, fail);
  if (type == "Sequence") {
    const std::string list_key = kSequenceKey.at(slot);
    const json& steps = node.at(list_key);
    for (size_t i = 0; i < steps.size(); ++i)
      check_component(steps[i], slot, where + "." + list_key + "[" + std::to_string(i) + "]", fail);
  } else if (type == "TemplateProcessing") {
    check_template(node, here, fail);
  }
}

}  // namespace

void check_tokenizer_json_shape(const json& tokenizer, const Fail& fail) {
  if (!tokenizer.is_object()) fail("not a tokenizer.json object");
  check(tokenizer, "tokenizer.json",
        {{"version", Type::string, Need::optional},
         {"truncation", Type::object, Need::nullable},
         {"padding", Type::object, Need::nullable},
         {"added_tokens", Type::list, Need::optional},
         {"normalizer", Type::object, Need::nullable},
         {"pre_tokenizer", Type::object, Need::nullable},
         {"model", Type::object, Need::required},
         {"post_processor", Type::object, Need::nullable},
         {"decoder", Type::object, Need::nullable}},
        fail);
  if (tokenizer.contains("version") && tokenizer.at("version") != "1.0")
    fail("tokenizer.json: version " + tokenizer.at("version").dump() + " is not the one HF tokenizers reads (\"1.0\")");
  const json* truncation = tokenizer.contains("truncation") ? &tokenizer.at("truncation") : nullptr;
  if (truncation && !truncation->is_null())
    check(*truncation, "truncation",
          {{"direction", Type::string, Need::optional},
           {"max_length", Type::count, Need::required},
           {"strategy", Type::string, Need::required},
           {"stride", Type::count, Need::required}},
          fail);
  const json* padding = tokenizer.contains("padding") ? &tokenizer.at("padding") : nullptr;
  if (padding && !padding->is_null())
    check(*padding, "padding",
          {{"strategy", Type::any, Need::required},
           {"direction", Type::string, Need::required},
           {"pad_to_multiple_of", Type::count, Need::nullable},
           {"pad_id", Type::count, Need::required},
           {"pad_type_id", Type::count, Need::required},
           {"pad_token", Type::string, Need::required}},
          fail);
  for (const auto& [slot, list_key] : kSequenceKey) {
    (void)list_key;
    if (tokenizer.contains(slot) && !tokenizer.at(slot).is_null())
      check_component(tokenizer.at(slot), slot, slot, fail);
  }
  const json& model = tokenizer.at("model");
  if (type_of(model) == "BPE" || !model.contains("type"))
    check(model, "model (BPE)",
          {{"dropout", Type::number, Need::nullable},
           {"unk_token", Type::string, Need::nullable},
           {"continuing_subword_prefix", Type::string, Need::nullable},
           {"end_of_word_suffix", Type::string, Need::nullable},
           {"fuse_unk", Type::boolean, Need::nullable},
           {"byte_fallback", Type::boolean, Need::nullable},
           {"ignore_merges", Type::boolean, Need::nullable},
           {"vocab", Type::object, Need::required},
           {"merges", Type::list, Need::required}},
          fail);
  if (tokenizer.contains("added_tokens")) {
    const json& added = tokenizer.at("added_tokens");
    for (size_t i = 0; i < added.size(); ++i)
      check(added[i], "added_tokens[" + std::to_string(i) + "]",
            {{"id", Type::count, Need::required},
             {"content", Type::string, Need::required},
             {"single_word", Type::boolean, Need::required},
             {"lstrip", Type::boolean, Need::required},
             {"rstrip", Type::boolean, Need::required},
             {"normalized", Type::boolean, Need::required},
             {"special", Type::boolean, Need::required}},
            fail);
  }
}

}  // namespace ptrain
