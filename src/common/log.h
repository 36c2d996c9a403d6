// Console logging for ptrain. spdlog lives behind this header in its own translation unit
// (log.cpp) because Debian's spdlog is built on fmt 9 while LibTorch ships fmt 12 headers;
// callers build messages with log::cat(...) and the number helpers below.
#pragma once
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

namespace ptrain::log {

enum class Level { debug, info, warn, error };

// Non-zero ranks print only warnings and errors (prefixed with their rank): the one helper
// for rank-0-only printing.
void set_rank(int rank, int world_size);
void set_level(Level level);
void write(Level level, std::string_view message);

template <class... Args>
std::string cat(const Args&... args) {
  std::ostringstream out;
  (out << ... << args);
  return out.str();
}
template <class... Args>
void debug(const Args&... a) {
  write(Level::debug, cat(a...));
}
template <class... Args>
void info(const Args&... a) {
  write(Level::info, cat(a...));
}
template <class... Args>
void warn(const Args&... a) {
  write(Level::warn, cat(a...));
}
template <class... Args>
void error(const Args&... a) {
  write(Level::error, cat(a...));
}

std::string fixed(double value, int decimals);  // 3.1416
std::string sci(double value, int decimals);    // 3.00e-04
std::string bytes(double n);                    // "812.4 MiB" (binary units)
std::string grouped(double value);              // "12,345" (rounded to an integer)

}  // namespace ptrain::log
