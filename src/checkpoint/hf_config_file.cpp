#include "checkpoint/hf_config_file.h"

#include <cstdint>
#include <filesystem>
#include <iterator>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
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
}  // namespace

std::string hf_config_file(const std::string& dir) {
  const fs::path base = fs::path(dir) / "config.json";
  if (!fs::is_regular_file(base)) return base.string();
  const json c = read_json_file(base.string());
  const auto listed = c.is_object() ? c.find("configuration_files") : c.end();
  if (!c.is_object() || listed == c.end()) return base.string();
  const std::string where = base.string() + ": configuration_files";
  // transformers iterates the value: a list's items, an object's keys, a string's characters (none
  // of which names a file); anything else makes it fail.
  std::vector<std::string> names;
  if (listed->is_array()) {
    for (const auto& item : *listed) {
      if (!item.is_string())
        throw UnsupportedInput(where + " holds " + item.dump() + ": transformers reads file names there, and fails " +
                               "on anything else (give names such as \"config.4.0.0.json\")");
      names.push_back(item.get<std::string>());
    }
  } else if (listed->is_object()) {
    for (auto it = listed->begin(); it != listed->end(); ++it) names.push_back(it.key());
  } else if (!listed->is_string()) {
    throw UnsupportedInput(where + " = " + listed->dump() +
                           ": transformers reads a list of file names there, and fails on this");
  }
  std::map<std::string, std::string> by_version;  // sorted as Python sorts the strings
  for (const auto& name : names)
    if (name.starts_with("config.") && name.ends_with(".json") && name != "config.json")
      by_version[name.substr(7, name.size() - 12)] = name;
  std::string chosen = "config.json";
  for (const auto& [version, name] : by_version) {
    const auto numbers = release_numbers(version);
    if (!numbers)
      throw UnsupportedInput(where + " names '" + name + "': transformers compares its version '" + version +
                             "' with its own, and ptrain compares plain releases (N.N.N) only (rename the file)");
    if (!not_above_reference(*numbers)) break;
    chosen = name;
  }
  const fs::path file = fs::path(dir) / chosen;
  if (!fs::is_regular_file(file))
    throw RuntimeError(where + " makes transformers 5.23 read '" + chosen + "', which is missing");
  return file.string();
}

}  // namespace ptrain
