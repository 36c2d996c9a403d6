// JSON files ptrain did not write (config.json, tokenizer_config.json, adapter_config.json, ...):
// read whole, a parse error named with the file; integers in them read checked — a number that is
// not a JSON integer (48.0, 1e30) is refused by name, since converting a float that does not fit to
// an integer type is undefined behaviour, and 48.0 is a value transformers refuses too.
#pragma once
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

// The JSON value in the file at `path`; throws RuntimeError naming the file when it does not parse
// (a corrupt file, exit code 1) or cannot be read.
inline nlohmann::json read_json_file(const std::string& path) {
  try {
    return nlohmann::json::parse(read_text_file(path));
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError("'" + path + "' is not valid JSON: " + e.what());
  }
}

// `v` as an int64; throws UnsupportedInput naming `what` for anything but an integer in range.
inline int64_t json_integer(const nlohmann::json& v, const std::string& what) {
  const bool fits = v.is_number_integer() &&
                    (!v.is_number_unsigned() || v.get<uint64_t>() <= uint64_t{std::numeric_limits<int64_t>::max()});
  if (!fits) throw UnsupportedInput(what + " must be an integer (got " + v.dump() + ")");
  return v.get<int64_t>();
}

}  // namespace ptrain
