// pytorch_model.bin (and its shards, pytorch_model-0000K-of-0000N.bin) as torch.save writes it
// since PyTorch 1.6: a zip archive whose data.pkl pickles a dict of name -> tensor (an
// OrderedDict for model.state_dict()) and whose data/<key> records hold the tensors' storages.
// Read as transformers reads it, torch.load(weights_only=True, map_location="cpu"): the zip by
// LibTorch's PyTorchStreamReader; the pickle by a small machine of ptrain's own that builds
// containers, strings, numbers and tensors and nothing else (LibTorch's unpickler turns an
// OrderedDict into None), refusing any other class or function a pickle names — the name given,
// nothing run. Each tensor's bytes are read from its storage's record when the tensor is asked
// for (one at a time, so a load holds one tensor's bytes beside its copy); a view of part of a
// storage reads that part only (a state dict of views into one flat buffer reads it once). Refused by name: torch's
// legacy format (before 1.6, not a zip), a pickle that is not a dict of tensors, a dtype safetensors has no name for, a
// view reaching past its storage, a big-endian archive.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "checkpoint/safetensors.h"

namespace caffe2::serialize {
class PyTorchStreamReader;
}

namespace ptrain {

// What data.pkl says of one tensor: its storage's record and dtype, and the view of it.
struct TorchBinTensor {
  std::string record;  // "data/<key>"
  at::ScalarType dtype = at::kFloat;
  int64_t storage_numel = 0;
  int64_t offset = 0;
  std::vector<int64_t> size, stride;
};

// The tensors of a torch.save pickle (`pickle`, the bytes of data.pkl) by name, in file order;
// RuntimeError naming `what` and the problem otherwise. (Separate from the zip for the fuzzer.)
std::vector<std::pair<std::string, TorchBinTensor>> read_torch_pickle(const std::string& what,
                                                                      const std::string& pickle);

class TorchBinFile : public WeightFile {
 public:
  explicit TorchBinFile(const std::string& path);  // throws RuntimeError naming the file
  ~TorchBinFile() override;

  const std::string& path() const override { return path_; }
  const std::vector<SafetensorsEntry>& entries() const override { return entries_; }
  bool contains(const std::string& name) const override { return index_.count(name) > 0; }
  const SafetensorsEntry& entry(const std::string& name) const override;
  at::Tensor tensor(const std::string& name) const override;

 private:
  std::string path_;
  std::unique_ptr<caffe2::serialize::PyTorchStreamReader> zip_;
  std::vector<SafetensorsEntry> entries_;
  std::vector<TorchBinTensor> views_;
  std::map<std::string, size_t> index_;
};

}  // namespace ptrain
