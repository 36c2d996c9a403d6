#include "common/check.h"

namespace ptrain {

std::string positive(double v, const char* what) {
  return v > 0 ? "" : std::string(what) + " (got " + std::to_string(v) + ")";
}

std::string at_least(int64_t v, int64_t min) {
  return v >= min ? "" : "must be >= " + std::to_string(min) + " (got " + std::to_string(v) + ")";
}

}  // namespace ptrain
