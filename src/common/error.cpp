#include "common/error.h"

namespace ptrain {

std::string ConfigProblem::str() const {
  return "error: " + file + ":" + std::to_string(line) + ": " + key + ": " + reason;
}

static std::string join(const std::vector<ConfigProblem>& problems) {
  std::string out;
  for (const auto& p : problems) out += p.str() + "\n";
  return out;
}

ConfigError::ConfigError(std::vector<ConfigProblem> ps) : std::runtime_error(join(ps)), problems(std::move(ps)) {}

}  // namespace ptrain
