// A config file from anywhere (a copy from a forum, a hand edit, a generated one): parsed,
// overridden, its model shape resolved and every rule checked, then written back as the resolved
// TOML — as `ptrain check --plan` does for a config meant for another machine (no file of this
// one is read). A bad config must be refused with ConfigError / UsageError; a crash, an
// overflow or undefined behaviour is a finding.
#include "fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ptrain::fuzz::as_file(data, size, "config.toml");
  ptrain::fuzz::check_plan(path, /*gpu=*/size % 2 == 0);  // both answers to "is there a GPU"
  return 0;
}
