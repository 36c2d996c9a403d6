#include "data/batch.h"

#include <ATen/ATen.h>

#include "model/loss.h"

namespace ptrain {

int64_t Batch::trained_tokens() const { return targets.ne(kIgnoreIndex).sum().item<int64_t>(); }

Batch Batch::to(const c10::Device& device) const {
  return {inputs.to(device), targets.to(device), doc_ids.defined() ? doc_ids.to(device) : at::Tensor(), pairs, labels,
          num_tokens};
}

Batch Batch::of_windows(const at::Tensor& windows) {
  const int64_t T = windows.size(1) - 1;
  return {windows.narrow(1, 0, T), windows.narrow(1, 1, T), at::Tensor(), at::Tensor(), at::Tensor(), windows.numel()};
}

}  // namespace ptrain
