// A model directory's config.json from anywhere (the first file ptrain reads of a download): the
// family, every key against what the family implements, RoPE in transformers 4 and 5 spellings,
// the sliding-window keys and bitsandbytes' quantization_config, then every rule — as `ptrain
// check --plan` reads a config whose model.hf_path points at the directory (its weights are not
// read). A config.json ptrain does not fully understand must be refused with an exception; a
// crash, an overflow or undefined behaviour is a finding.
#include <filesystem>

#include "fuzz_util.h"

namespace {
// This process's model directory and the run config pointing at it, written once.
std::string run_config() {
  static const std::string path = [] {
    const std::filesystem::path tmp = std::filesystem::path(ptrain::fuzz::as_file(nullptr, 0, "unused")).parent_path();
    std::filesystem::create_directories(tmp / "model");
    const std::string run = (tmp / "run.toml").string();
    std::ofstream(run) << "[model]\nhf_path = \"" << (tmp / "model").string() << "\"\n[data]\nseq_len = 64\n";
    return run;
  }();
  return path;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string run = run_config();
  const std::string dir = std::filesystem::path(run).parent_path() / "model";
  std::ofstream(dir + "/config.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  ptrain::fuzz::check_plan(run, /*gpu=*/size % 2 == 0);  // both answers to "is there a GPU"
  return 0;
}
