// spdlog backend of log.h; compiled without LibTorch's include paths (see log.h).
#include "common/log.h"

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <cmath>
#include <cstdio>

namespace ptrain::log {
namespace {
int g_rank = 0;
int g_world = 1;

spdlog::logger& logger() {
  static std::shared_ptr<spdlog::logger> instance = [] {
    auto sink = std::make_shared<spdlog::sinks::stderr_color_sink_mt>();
    auto l = std::make_shared<spdlog::logger>("ptrain", sink);
    l->set_pattern("%^[%H:%M:%S %L]%$ %v");
    l->set_level(spdlog::level::info);
    return l;
  }();
  return *instance;
}
}  // namespace

void set_rank(int rank, int world_size) {
  g_rank = rank;
  g_world = world_size;
}

void set_level(Level level) {
  static const spdlog::level::level_enum map[] = {spdlog::level::debug, spdlog::level::info, spdlog::level::warn,
                                                  spdlog::level::err};
  logger().set_level(map[static_cast<int>(level)]);
}

void write(Level level, std::string_view message) {
  if (g_rank != 0 && level < Level::warn) return;
  std::string text =
      g_world > 1 ? "[rank " + std::to_string(g_rank) + "] " + std::string(message) : std::string(message);
  switch (level) {
    case Level::debug:
      logger().debug(text);
      break;
    case Level::info:
      logger().info(text);
      break;
    case Level::warn:
      logger().warn(text);
      break;
    case Level::error:
      logger().error(text);
      break;
  }
  if (level >= Level::warn) logger().flush();
}

std::string fixed(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*f", decimals, value);
  return buf;
}

std::string sci(double value, int decimals) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.*e", decimals, value);
  return buf;
}

std::string bytes(double n) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  int u = 0;
  while (std::fabs(n) >= 1024.0 && u < 4) {
    n /= 1024.0;
    ++u;
  }
  return fixed(n, u == 0 ? 0 : 1) + " " + units[u];
}

std::string grouped(double value) {
  std::string digits = std::to_string(static_cast<long long>(std::llround(std::fabs(value))));
  std::string out;
  for (size_t i = 0; i < digits.size(); ++i) {
    if (i && (digits.size() - i) % 3 == 0) out += ',';
    out += digits[i];
  }
  return value < 0 ? "-" + out : out;
}

}  // namespace ptrain::log
