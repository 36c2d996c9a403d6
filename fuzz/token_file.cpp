// A token file (ptrain tokenize's output) from anywhere: the header is checked (magic, version,
// width, count against the size, vocabulary) and every token read. A malformed file must be
// refused with an exception; a crash, an out-of-bounds read or undefined behaviour is a finding.
#include <sys/stat.h>

#include <exception>
#include <vector>

#include "data/dataset.h"
#include "data/token_file.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ptrain::fuzz::as_file(data, size, "tokens.bin");
  try {
    (void)ptrain::read_token_header(path);
    ptrain::TokenData tokens(path, "tokens");
    std::vector<int64_t> out(static_cast<size_t>(std::min<int64_t>(tokens.size(), 1 << 16)));
    tokens.read(0, static_cast<int64_t>(out.size()), out.data());
  } catch (const std::exception&) {
  }
  return 0;
}
