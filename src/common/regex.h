// Regular expressions from files ptrain reads (tokenizer.json's split and replace patterns,
// adapter_config.json's target_modules): PCRE2, UTF-8 with Unicode properties, the dialect of
// Python's `re` and Rust's `regex` for everything those files use. Every match runs under a step
// limit, so a pattern that backtracks without end fails with an error instead of hanging.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

namespace ptrain {

class Regex {
 public:
  // Compiles `pattern`; where it does not compile, calls `fail` with the reason (which must throw).
  Regex(const std::string& pattern, const std::function<void(const std::string&)>& fail);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // The [begin, end) of every non-overlapping match in `text`, left to right (an empty match
  // steps over one character and is left out; `empty`, where given, says whether there was one).
  // Throws RuntimeError naming the byte where matching failed.
  std::vector<std::pair<size_t, size_t>> matches(const std::string& text, bool* empty = nullptr) const;

  const std::string& pattern() const;

  // Whether the whole of `text` matches (Python's re.fullmatch), within `max_steps` of PCRE2's
  // matching. Throws RuntimeError where the limit is reached.
  bool full_match(const std::string& text, uint32_t max_steps) const;

 private:
  struct Code;
  std::unique_ptr<Code> code_;
};

}  // namespace ptrain
