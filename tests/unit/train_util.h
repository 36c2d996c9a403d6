// Helpers of the tests that run the trainer: a run's logged losses, its last logged line, a
// config loaded with overrides (no environment checks).
#pragma once
#include <cstdint>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "config/config.h"

namespace ptrain::test {

// A metric of metrics.jsonl's step records by step (the records that hold it).
inline std::map<int64_t, double> metric_by_step(const std::string& metrics_path, const std::string& name) {
  std::map<int64_t, double> out;
  std::ifstream in(metrics_path);
  for (std::string line; std::getline(in, line);) {
    auto j = nlohmann::json::parse(line);
    if (j.contains(name)) out[j["step"].get<int64_t>()] = j[name].get<double>();
  }
  return out;
}

inline std::map<int64_t, double> losses(const std::string& metrics_path) {
  return metric_by_step(metrics_path, "loss");
}

inline std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (line.find("\"loss\"") != std::string::npos) last = line;
  return last;
}

inline Config load(const std::string& path, std::vector<std::string> sets = {}) {
  return load_config(path, sets, Environment{});
}

}  // namespace ptrain::test
