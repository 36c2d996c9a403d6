// A file of one JSON array of records (data.format = "json", alpaca_data.json and ShareGPT dumps)
// from anywhere, split into its elements by json_array_blocks at two block sizes, each element
// then parsed as the sample builder parses it. A malformed file must be refused with an
// exception; a crash, an out-of-bounds read, undefined behaviour — or elements that depend on
// where the blocks cut the file, or whether it is refused — is a finding.
#include <cstdlib>
#include <exception>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "data/json_array.h"
#include "fuzz_util.h"

namespace {

struct Split {
  std::vector<std::string> elements;
  std::vector<int64_t> indices;
  bool refused = false;
};

Split split(const std::string& path, size_t block_bytes) {
  Split out;
  try {
    ptrain::json_array_blocks(path, block_bytes,
                              [&](std::vector<std::string>&& e, std::vector<int64_t>&& i, int64_t, int64_t) {
                                out.elements.insert(out.elements.end(), e.begin(), e.end());
                                out.indices.insert(out.indices.end(), i.begin(), i.end());
                              });
  } catch (const std::exception&) {
    out.refused = true;
  }
  return out;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ptrain::fuzz::as_file(data, size, "records.json");
  const Split whole = split(path, size_t{1} << 20), bytes = split(path, 3);
  // The split may not depend on the block size (a refused file may have handed over a different
  // number of blocks before the refusal: the load fails either way).
  if (whole.refused != bytes.refused ||
      (!whole.refused && (whole.elements != bytes.elements || whole.indices != bytes.indices)))
    std::abort();
  for (const auto& e : whole.elements) (void)nlohmann::json::parse(e, nullptr, /*allow_exceptions=*/false);
  return 0;
}
