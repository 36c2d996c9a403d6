// A JSON value as Python's json.dumps(value, ensure_ascii=False) writes it — what transformers'
// `tojson` filter renders in a chat template (tools, a tool call's arguments): ", " and ": "
// separators, keys in the order the record gives them (an ordered_json parse keeps it, and a
// repeated key keeps its first place with its last value, as json.loads does), floats as
// Python's repr (the shortest digits that read back, "1e-05", "1e+16", "2.0"), strings with only
// `"`, `\` and the control characters below U+0020 escaped.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

namespace ptrain {

// A JSON integer past 64 bits parses as a float, which Python would write back as an integer:
// callers refuse such input first (wide_json_integer). `indent` >= 0: json.dumps(value,
// ensure_ascii=False, indent=indent) — each item on its own line, "," and ": " between.
std::string python_json(const nlohmann::ordered_json& value, int indent = -1);

// The first integer literal of `text` (a JSON text) too large for 64 bits, which a parse turns into
// a float; "" where there is none (or the text does not parse).
std::string wide_json_integer(const std::string& text);

}  // namespace ptrain
