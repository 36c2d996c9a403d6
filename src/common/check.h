// What an options struct (data/, model/, optim/, parallel/options.h) finds wrong with its own
// values: the rules that read only its section live beside it; the config reports each problem
// at its key's line (config/validate.cpp, which also holds the rules that read several sections
// or the files a config names).
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace ptrain {

struct OptionProblem {
  std::string key;     // "section.key"
  std::string reason;  // what is wrong and the fix
};

class OptionProblems {
 public:
  // Records `reason` against `key` unless it is empty (the rule holds).
  void check(const char* key, std::string reason) {
    if (!reason.empty()) list_.push_back({key, std::move(reason)});
  }
  const std::vector<OptionProblem>& list() const { return list_; }

 private:
  std::vector<OptionProblem> list_;
};

// The range rules' reasons ("" when satisfied).
std::string positive(double v, const char* what = "must be > 0");
std::string at_least(int64_t v, int64_t min);
// "" when min <= v <= max; above max, the reason says `above` (why nothing is that large).
std::string within(int64_t v, int64_t min, int64_t max, const char* above);

}  // namespace ptrain
