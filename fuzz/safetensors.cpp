// A safetensors file from anywhere: the header is parsed and checked (offsets, dtypes, shapes,
// overlaps, holes), then every tensor is read whole. A malformed file must be refused with an
// exception; a crash, an out-of-bounds read or undefined behaviour is a finding.
#include <ATen/ATen.h>
#include <sys/stat.h>

#include <exception>

#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ptrain::fuzz::as_file(data, size, "model.safetensors");
  try {
    ptrain::SafetensorsFile f(path);
    for (const auto& e : f.entries()) {
      at::Tensor t = f.tensor(e.name);
      (void)t.contiguous().view(at::kByte).sum().item<int64_t>();  // every byte read
    }
    (void)f.metadata();
  } catch (const std::exception&) {
  }
  return 0;
}
