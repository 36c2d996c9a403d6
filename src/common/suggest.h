// "Did you mean ...?" for mistyped names (config keys and sections, subcommands, flags).
#pragma once
#include <cstddef>
#include <string>
#include <vector>

namespace ptrain {

// Levenshtein distance (insertions, deletions, substitutions of bytes).
size_t edit_distance(const std::string& a, const std::string& b);
// The candidate closest to `name` within a third of its length (at least 2 edits), or "".
std::string closest(const std::string& name, const std::vector<std::string>& candidates);

}  // namespace ptrain
