// A PEFT adapter's adapter_config.json from anywhere, for the Llama fixture model (3 blocks):
// peft_type, task_type, every key against what ptrain implements, r / lora_alpha / dropout /
// rsLoRA, and target_modules as names, "all-linear" or a regex matched against every module
// name. An adapter config ptrain does not fully understand must be refused with an exception; a
// crash, undefined behaviour or a hang (a regex that backtracks without end) is a finding.
#include <exception>
#include <filesystem>

#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const ptrain::LlamaShape shape = ptrain::read_hf_config(PTRAIN_SOURCE_DIR "/tests/fixtures/hf_odd");
  const std::string dir = std::filesystem::path(ptrain::fuzz::as_file(data, size, "adapter_config.json")).parent_path();
  try {
    (void)ptrain::read_peft_config(dir, shape);
  } catch (const std::exception&) {
  }
  return 0;
}
