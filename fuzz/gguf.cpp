// A GGUF file from anywhere: the header, every metadata value and every tensor descriptor parsed
// and checked against the file's size, then every tensor of a type ptrain reads dequantized; then
// the same file as a base model (its config and tensor map) and as a tokenizer (tokenizer.ggml.*
// built into a tokenizer.json and read). A malformed file must be refused with an exception; a
// crash, an out-of-bounds read or undefined behaviour is a finding.
#include <ATen/ATen.h>

#include <exception>

#include "checkpoint/gguf_model.h"
#include "checkpoint/gguf_reader.h"
#include "fuzz_util.h"
#include "tokenizer/tokenizer.h"

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
  try {
    ptrain::GgufModel m(path);
    m.verify();
  } catch (const std::exception&) {
  }
  try {
    const ptrain::Tokenizer tok(path);
    (void)tok.decode(tok.encode("Hello, world! 12345 \xc3\xa9"));
  } catch (const std::exception&) {
  }
  return 0;
}
