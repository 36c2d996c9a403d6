// metrics.jsonl: one JSON object per logged step (and per evaluation), flushed as written so
// a crashed or interrupted run keeps everything logged so far.
#pragma once
#include <cstdio>
#include <string>
#include <utility>
#include <variant>
#include <vector>

namespace ptrain {

class MetricsWriter {
 public:
  using Field = std::pair<std::string, std::variant<double, int64_t, std::string>>;
  // append=true continues an existing file (resume); otherwise it starts empty.
  MetricsWriter(const std::string& path, bool append);
  ~MetricsWriter();
  void write(const std::vector<Field>& fields);

 private:
  std::FILE* file_ = nullptr;
};

}  // namespace ptrain
