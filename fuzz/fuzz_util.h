// What the fuzz targets share: the input as a file (the readers take paths, as ptrain gets them),
// and the rule that a malformed input may only be refused with an exception.
#pragma once
#include <sys/stat.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <string>

#include "config/config.h"

namespace ptrain::fuzz {

// A path private to this process (under $PTRAIN_FUZZ_TMP, else /tmp), holding `size` bytes of `data`.
inline std::string as_file(const uint8_t* data, size_t size, const std::string& name) {
  const char* root = std::getenv("PTRAIN_FUZZ_TMP");
  const std::string dir = std::string(root ? root : "/tmp") + "/ptrain_fuzz_" + std::to_string(::getpid());
  ::mkdir(dir.c_str(), 0700);
  const std::string path = dir + "/" + name;
  std::ofstream(path, std::ios::binary | std::ios::trunc).write(reinterpret_cast<const char*>(data), size);
  return path;
}

// Loads the run config at `path` as `ptrain check --plan` does for another machine (no file of
// this one read), with or without a GPU, and writes it back as the resolved TOML; a refusal is an
// exception, which is all a bad input may cause.
inline void check_plan(const std::string& path, bool gpu) {
  Environment elsewhere;
  elsewhere.cuda_available = gpu;
  elsewhere.local = false;
  try {
    (void)to_toml(load_config(path, {}, elsewhere));
  } catch (const std::exception&) {
  }
}

}  // namespace ptrain::fuzz
