#include "train/metrics.h"

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>

#include "common/error.h"

namespace ptrain {

MetricsWriter::MetricsWriter(const std::string& path, bool append) {
  file_ = std::fopen(path.c_str(), append ? "a" : "w");
  if (!file_) throw RuntimeError("cannot write '" + path + "': " + std::strerror(errno));
}

MetricsWriter::~MetricsWriter() {
  if (file_) std::fclose(file_);
}

void MetricsWriter::write(const std::vector<Field>& fields) {
  nlohmann::ordered_json j = nlohmann::ordered_json::object();
  for (const auto& [k, v] : fields) std::visit([&, &key = k](const auto& x) { j[key] = x; }, v);
  const std::string line = j.dump() + "\n";
  std::fwrite(line.data(), 1, line.size(), file_);
  std::fflush(file_);
}

}  // namespace ptrain
