#include "checkpoint/hf_config_file.h"

#include <cstdint>
#include <filesystem>
#include <functional>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string_view>
#include <vector>

#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {
// The transformers release whose reading ptrain reproduces, for configuration_files.
constexpr int64_t kTransformersRelease[] = {5, 23, 0};

// A version packaging reads as a plain release, "N(.N)*" with an optional leading v: its numbers.
std::optional<std::vector<int64_t>> release_numbers(const std::string& v) {
  std::vector<int64_t> out;
  size_t i = !v.empty() && (v[0] == 'v' || v[0] == 'V') ? 1 : 0;
  while (true) {
    const size_t start = i;
    int64_t n = 0;
    for (; i < v.size() && v[i] >= '0' && v[i] <= '9' && i - start < 9; ++i) n = n * 10 + (v[i] - '0');
    if (i == start || (i < v.size() && v[i] >= '0' && v[i] <= '9')) return std::nullopt;
    out.push_back(n);
    if (i == v.size()) return out;
    if (v[i++] != '.') return std::nullopt;
  }
}

// Whether release `v` is not above transformers 5.23.0 (missing numbers count as 0).
bool not_above_reference(const std::vector<int64_t>& v) {
  const size_t n = std::max(v.size(), std::size(kTransformersRelease));
  for (size_t i = 0; i < n; ++i) {
    const int64_t a = i < v.size() ? v[i] : 0;
    const int64_t b = i < std::size(kTransformersRelease) ? kTransformersRelease[i] : 0;
    if (a != b) return a < b;
  }
  return true;
}
// The file transformers 5.23 reads from the names `listed` holds (config.json's
// configuration_files, tokenizer_config.json's fast_tokenizer_files): the name of the last version
// not above its own, versions sorted as Python sorts strings and stopping at the first above;
// `fallback` when none is. `version_of` gives a name's version, or nothing for a name transformers
// passes over. `where` names the list in errors.
using VersionOf = std::function<std::optional<std::string>(const std::string&)>;
std::string versioned_choice(const json& listed, const std::string& where, const std::string& fallback,
                             const VersionOf& version_of) {
  // transformers iterates the value: a list's items, an object's keys, a string's characters (none
  // of which names a file); anything else makes it fail.
  std::vector<std::string> names;
  if (listed.is_array()) {
    for (const auto& item : listed) {
      if (!item.is_string())
        throw UnsupportedInput(where + " holds " + item.dump() + ": transformers reads file names there, and fails " +
                               "on anything else (give names such as \"" + fallback.substr(0, fallback.size() - 5) +
                               ".4.0.0.json\")");
      names.push_back(item.get<std::string>());
    }
  } else if (listed.is_object()) {
    for (auto it = listed.begin(); it != listed.end(); ++it) names.push_back(it.key());
  } else if (!listed.is_string()) {
    throw UnsupportedInput(where + " = " + listed.dump() +
                           ": transformers reads a list of file names there, and fails on this");
  }
  std::map<std::string, std::string> by_version;  // sorted as Python sorts the strings; a later name wins
  for (const auto& name : names)
    if (const auto version = version_of(name)) by_version[*version] = name;
  std::string chosen = fallback;
  for (const auto& [version, name] : by_version) {
    const auto numbers = release_numbers(version);
    if (!numbers)
      throw UnsupportedInput(where + " names '" + name + "': transformers compares its version '" + version +
                             "' with its own, and ptrain compares plain releases (N.N.N) only (rename the file)");
    if (!not_above_reference(*numbers)) break;
    chosen = name;
  }
  return chosen;
}

// The version transformers reads in a fast_tokenizer_files name: what its regex
// `tokenizer\.(.*)\.json` captures, searched anywhere in the name (the leftmost "tokenizer." that
// a ".json" follows on the same line, up to the last such ".json").
std::optional<std::string> tokenizer_file_version(const std::string& name) {
  const std::string head = "tokenizer.";
  for (size_t at = name.find(head); at != std::string::npos; at = name.find(head, at + 1)) {
    const size_t from = at + head.size();
    const std::string_view line = std::string_view(name).substr(from, name.find('\n', from) - from);
    if (const size_t dot = line.rfind(".json"); dot != std::string_view::npos) return std::string(line.substr(0, dot));
  }
  return std::nullopt;
}

// The path of the file transformers reads in DIR in place of `base`: `base`, unless the JSON object
// in DIR/`listing` holds the list `key` — then the file versioned_choice() picks, which must be there.
std::string versioned_file(const std::string& dir, const std::string& base, const std::string& listing,
                           const std::string& key, const VersionOf& version_of) {
  const fs::path list_file = fs::path(dir) / listing;
  if (!fs::is_regular_file(list_file)) return (fs::path(dir) / base).string();
  const json c = read_json_file(list_file.string());
  const auto listed = c.is_object() ? c.find(key) : c.end();
  if (!c.is_object() || listed == c.end()) return (fs::path(dir) / base).string();
  const std::string where = list_file.string() + ": " + key;
  const std::string chosen = versioned_choice(*listed, where, base, version_of);
  // transformers joins the name to DIR as given, wherever that leads; ptrain reads what a model
  // directory holds, never a file a config names outside it.
  const fs::path inside = fs::path(chosen).lexically_normal();
  if (inside.is_absolute() || inside.empty() || *inside.begin() == "..")
    throw UnsupportedInput(where + " names '" + chosen + "', outside the model directory: ptrain reads the files " +
                           "inside it only (copy the file into " + dir + " and name it there)");
  const fs::path file = fs::path(dir) / chosen;
  if (chosen != base && !fs::is_regular_file(file))
    throw RuntimeError(where + " makes transformers 5.23 read '" + chosen + "', which is missing");
  return file.string();
}
}  // namespace

std::string hf_config_file(const std::string& dir) {
  const auto version_of = [](const std::string& name) -> std::optional<std::string> {
    if (!name.starts_with("config.") || !name.ends_with(".json") || name == "config.json") return std::nullopt;
    return name.substr(7, name.size() - 12);
  };
  return versioned_file(dir, "config.json", "config.json", "configuration_files", version_of);
}

std::string hf_tokenizer_file(const std::string& dir) {
  return versioned_file(dir, "tokenizer.json", "tokenizer_config.json", "fast_tokenizer_files", tokenizer_file_version);
}

}  // namespace ptrain
