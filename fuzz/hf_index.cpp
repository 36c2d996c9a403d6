// A model directory's model.safetensors.index.json from anywhere, beside two valid shards:
// the index must name only shards of the directory, map each tensor to the shard that holds it
// and leave none of a shard's tensors out; then every mapped tensor is read whole. A bad index
// must be refused with an exception; a crash, a read outside a shard or undefined behaviour is
// a finding.
#include <ATen/ATen.h>

#include <exception>
#include <filesystem>

#include "checkpoint/hf.h"
#include "checkpoint/safetensors.h"
#include "fuzz_util.h"

namespace {
// The directory of this process's fuzzing, with its two shards written once.
std::string model_dir() {
  static const std::string dir = [] {
    const std::string d = std::filesystem::path(ptrain::fuzz::as_file(nullptr, 0, "unused")).parent_path() / "model";
    std::filesystem::create_directories(d);
    ptrain::write_safetensors(d + "/model-00001-of-00002.safetensors",
                              {{"model.embed_tokens.weight", at::arange(12, at::kFloat).reshape({3, 4})},
                               {"model.norm.weight", at::ones({4}, at::kBFloat16)}});
    ptrain::write_safetensors(d + "/model-00002-of-00002.safetensors",
                              {{"lm_head.weight", at::full({3, 4}, 0.5, at::kFloat)}});
    return d;
  }();
  return dir;
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string dir = model_dir();
  std::ofstream(dir + "/model.safetensors.index.json", std::ios::binary | std::ios::trunc)
      .write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  try {
    const ptrain::HfCheckpoint ck(dir);
    for (const auto& name : ck.names()) (void)ck.tensor(name).contiguous().view(at::kByte).sum().item<int64_t>();
  } catch (const std::exception&) {
  }
  return 0;
}
