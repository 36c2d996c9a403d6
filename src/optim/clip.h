// Global-norm gradient clipping (torch.nn.utils.clip_grad_norm_ semantics) over sharded
// gradients: squared shard norms are summed across ranks with one all-reduce.
#pragma once
#include <ATen/Tensor.h>

#include <vector>

namespace ptrain {

class Collectives;

// Returns the total L2 norm of all gradients (all ranks) before clipping; when max_norm > 0
// and the norm exceeds it, scales every local gradient by max_norm / (norm + 1e-6).
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives* comm = nullptr);

}  // namespace ptrain
