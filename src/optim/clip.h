// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_ semantics).
#pragma once
#include <ATen/Tensor.h>

#include <vector>

namespace ptrain {

// Returns the total L2 norm of all gradients before clipping; when max_norm > 0 and the
// norm exceeds it, scales every gradient by max_norm / (norm + 1e-6).
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm);

}  // namespace ptrain
