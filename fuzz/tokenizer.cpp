// A tokenizer.json from anywhere, then text through it: the input is the JSON, a NUL byte, and
// a text to encode; the ids are decoded back. A tokenizer ptrain does not fully understand must be
// refused with an exception, never mis-handled; a crash, an out-of-bounds read or undefined
// behaviour (also in the BPE merges, normalizers and pre-tokenizer regexes) is a finding. So is a
// place where the tokenizer says a text may be cut (cuts_before, where `ptrain tokenize` cuts a
// file for its threads) whose two parts encode to other ids than the whole.
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto* nul = static_cast<const uint8_t*>(std::memchr(data, 0, size));
  const size_t json_size = nul ? static_cast<size_t>(nul - data) : size;
  const std::string text = nul ? std::string(reinterpret_cast<const char*>(nul + 1), size - json_size - 1) : "";
  const std::string path = ptrain::fuzz::as_file(data, json_size, "tokenizer.json");
  try {
    ptrain::Tokenizer tok(path);
    const std::vector<int32_t> ids = tok.encode(text);
    (void)tok.decode(ids);
    (void)tok.encode(text, /*text_start=*/false);
    int tried = 0;
    for (size_t pos = 1; pos < text.size() && tried < 8; ++pos) {
      if (text[pos - 1] != '\n' || !tok.cuts_before(text, pos)) continue;
      ++tried;
      std::vector<int32_t> parts = tok.encode(text.substr(0, pos));
      const std::vector<int32_t> tail = tok.encode(text.substr(pos), /*text_start=*/false);
      parts.insert(parts.end(), tail.begin(), tail.end());
      if (parts != ids) {
        std::fprintf(stderr, "cut at byte %zu gives other ids than the whole text\n", pos);
        std::abort();
      }
    }
  } catch (const std::exception&) {
  }
  return 0;
}
