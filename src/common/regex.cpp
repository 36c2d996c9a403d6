#include "common/regex.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/error.h"

namespace ptrain {

namespace {
std::string pcre2_message(int code) {
  PCRE2_UCHAR msg[256];
  pcre2_get_error_message(code, msg, sizeof msg);
  return reinterpret_cast<const char*>(msg);
}
}  // namespace

struct Regex::Code {
  std::string pattern;  // for the errors
  pcre2_code* code = nullptr;
  ~Code() { pcre2_code_free(code); }
};

Regex::Regex(const std::string& pattern, const std::function<void(const std::string&)>& fail)
    : code_(std::make_unique<Code>()) {
  code_->pattern = pattern;
  int err = 0;
  PCRE2_SIZE offset = 0;
  code_->code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP, &err,
                              &offset, nullptr);
  if (!code_->code)
    fail("the regex '" + pattern + "' does not compile at offset " + std::to_string(offset) + ": " +
         pcre2_message(err));
  pcre2_jit_compile(code_->code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter gives the same matches
}

Regex::~Regex() = default;

const std::string& Regex::pattern() const { return code_->pattern; }

std::vector<std::pair<size_t, size_t>> Regex::matches(const std::string& text, bool* empty) const {
  std::vector<std::pair<size_t, size_t>> out;
  if (empty) *empty = false;
  if (text.empty()) return out;
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  size_t pos = 0;
  while (pos < text.size()) {
    // PCRE2's default step limit (10 million per match) bounds a pattern that backtracks.
    const int rc = pcre2_match(code_->code, subject, text.size(), pos, pos == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      pcre2_match_data_free(md);
      throw RuntimeError("matching the regex '" + code_->pattern + "' at byte " + std::to_string(pos) + ": " +
                         pcre2_message(rc));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    if (ov[1] > ov[0]) {
      out.emplace_back(ov[0], ov[1]);
      pos = ov[1];
    } else {  // an empty match: step over its character (text is valid UTF-8, checked at pos 0)
      if (empty) *empty = true;
      pos = ov[0] + 1;
      while (pos < text.size() && (static_cast<unsigned char>(text[pos]) & 0xC0) == 0x80) ++pos;
    }
  }
  pcre2_match_data_free(md);
  return out;
}

bool Regex::full_match(const std::string& text, uint32_t max_steps) const {
  pcre2_match_context* context = pcre2_match_context_create(nullptr);
  pcre2_set_match_limit(context, max_steps);
  pcre2_match_data* md = pcre2_match_data_create_from_pattern(code_->code, nullptr);
  // The interpreter: PCRE2_ENDANCHORED is not supported by the JIT.
  const int rc = pcre2_match(code_->code, reinterpret_cast<PCRE2_SPTR>(text.data()), text.size(), 0,
                             PCRE2_ANCHORED | PCRE2_ENDANCHORED | PCRE2_NO_JIT, md, context);
  pcre2_match_data_free(md);
  pcre2_match_context_free(context);
  if (rc == PCRE2_ERROR_NOMATCH) return false;
  if (rc < 0)
    throw RuntimeError("matching the regex '" + code_->pattern + "' against '" + text + "': " + pcre2_message(rc));
  return true;
}

}  // namespace ptrain
