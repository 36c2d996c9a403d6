// A model directory's tokenizer files from anywhere, read as transformers' AutoTokenizer reads
// them: the input is tokenizer_config.json, config.json, tokenizer.json, a text to encode,
// special_tokens_map.json and added_tokens.json, each ended by a NUL byte (a section left out:
// that file is absent). The class resolved from them may rebuild tokenizer.json's pipeline;
// whatever ptrain does not reproduce exactly must be refused with an exception. A crash, an
// out-of-bounds read or undefined behaviour is a finding.
#include <cstring>
#include <exception>
#include <filesystem>

#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string parts[6];
  size_t n = 0, at = 0;
  while (n < 6 && at <= size) {
    const auto* nul = n < 5 ? static_cast<const uint8_t*>(std::memchr(data + at, 0, size - at)) : nullptr;
    const size_t end = nul ? static_cast<size_t>(nul - data) : size;
    parts[n++] = std::string(reinterpret_cast<const char*>(data + at), end - at);
    at = end + 1;
    if (!nul) break;
  }
  const std::filesystem::path dir =
      std::filesystem::path(ptrain::fuzz::as_file(nullptr, 0, "unused")).parent_path() / "dir";
  std::filesystem::create_directories(dir);
  const char* names[6] = {"tokenizer_config.json",   "config.json",      "tokenizer.json", nullptr,
                          "special_tokens_map.json", "added_tokens.json"};
  for (size_t i = 0; i < 6; ++i) {
    if (!names[i]) continue;
    std::filesystem::remove(dir / names[i]);
    if (i < n) std::ofstream(dir / names[i], std::ios::binary) << parts[i];
  }
  try {
    ptrain::Tokenizer tok(dir.string());
    const std::vector<int32_t> ids = tok.encode(parts[3]);
    (void)tok.decode(ids);
    (void)tok.encode_with_special_tokens(parts[3]);
  } catch (const std::exception&) {
  }
  return 0;
}
