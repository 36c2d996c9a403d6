#include "common/check.h"

namespace ptrain {

std::string positive(double v, const char* what) {
  return v > 0 ? "" : std::string(what) + " (got " + std::to_string(v) + ")";
}

std::string at_least(int64_t v, int64_t min) {
  return v >= min ? "" : "must be >= " + std::to_string(min) + " (got " + std::to_string(v) + ")";
}

std::string within(int64_t v, int64_t min, int64_t max, const char* above) {
  if (v < min) return at_least(v, min);
  return v <= max ? "" : "must be <= " + std::to_string(max) + " (got " + std::to_string(v) + "): " + above;
}

}  // namespace ptrain
