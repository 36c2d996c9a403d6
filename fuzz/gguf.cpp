// A GGUF file from anywhere: the header, every metadata value and every tensor descriptor parsed
// and checked against the file's size, then every tensor of a type ptrain reads dequantized. A
// malformed file must be refused with an exception; a crash, an out-of-bounds read or undefined
// behaviour is a finding.
#include <ATen/ATen.h>

#include <exception>

#include "checkpoint/gguf_reader.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ptrain::fuzz::as_file(data, size, "model.gguf");
  try {
    ptrain::GgufFile f(path);
    for (const auto& [key, value] : f.metadata()) (void)value.type_name();
    for (const auto& t : f.tensors()) {
      if (t.numel > (int64_t{1} << 22)) continue;  // a valid header may claim more than memory holds
      (void)f.dequantize(t).sum().item<float>();   // every element read
    }
  } catch (const std::exception&) {
  }
  return 0;
}
