// Error types and their exit codes: UsageError/UnsupportedInput/ConfigError -> 2 (nothing started),
// everything else -> 1. Messages say what went wrong and what to do about it.
#pragma once
#include <stdexcept>
#include <string>
#include <vector>

namespace ptrain {

// Bad command line. Exit code 2.
struct UsageError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Input ptrain does not fully understand — a model's config.json key or checkpoint tensor, a
// tokenizer component, ... — refused by name rather than half-used. Exit code 2.
struct UnsupportedInput : UsageError {
  using UsageError::UsageError;
};

// One problem in a config: printed as `error: FILE:LINE: section.key: reason`.
struct ConfigProblem {
  std::string file;  // config path, or "--set" for command-line overrides
  int line = 0;      // 1-based; 0 when the value came from a default or preset
  std::string key;   // "section.key" (or "toml" for syntax errors)
  std::string reason;
  std::string str() const;
};

// Every problem found in a config at once. Exit code 2.
struct ConfigError : std::runtime_error {
  explicit ConfigError(std::vector<ConfigProblem> problems);
  std::vector<ConfigProblem> problems;
};

// A failure at run time (missing/corrupt file, I/O error, rank failure). Exit code 1.
struct RuntimeError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

}  // namespace ptrain
