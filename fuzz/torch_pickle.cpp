// The data.pkl of a torch.save archive (pytorch_model.bin) from anywhere, run by ptrain's pickle
// machine (checkpoint/torch_bin.h): containers, numbers, strings and tensor views built, every
// other name refused, every view checked against its storage. A malformed pickle must be refused
// with an exception; a crash, an out-of-bounds read, unbounded memory or undefined behaviour is a
// finding. (The zip around it is LibTorch's PyTorchStreamReader.)
#include <exception>
#include <string>

#include "checkpoint/torch_bin.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto tensors =
        ptrain::read_torch_pickle("fuzz input", std::string(reinterpret_cast<const char*>(data), size));
    for (const auto& [name, view] : tensors) (void)view.size.size();
  } catch (const std::exception&) {
  }
  return 0;
}
