// A checkpoint's meta.json from anywhere (a damaged disk, a hand edit, another program): every
// field the loader reads is checked before use; a valid one yields its model shape and parameter
// count. A bad file must be refused with an exception; a crash, a division by zero, an overflow
// or undefined behaviour is a finding.
#include <exception>
#include <nlohmann/json.hpp>

#include "checkpoint/meta.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const nlohmann::json meta = nlohmann::json::parse(data, data + size);
    ptrain::validate_checkpoint_meta(meta, "fuzz");
    const ptrain::LlamaShape shape = ptrain::shape_from_json(meta.at("shape"));
    (void)shape.total_params();
    (void)shape.describe();
  } catch (const std::exception&) {
  }
  return 0;
}
