// The global L2 norm of gradients sharded across ranks, and global-norm clipping by it
// (torch.nn.utils.clip_grad_norm_ semantics). Squares accumulate in float64 — a float32 norm
// over a multi-million-element shard is off by up to ~4e-4 relative, which made the clip factor
// (and so training) depend on the sharding — and are summed across ranks with one all-reduce.
// One code path for both steps: the common one adds the stored shard gradients, optimizer-in-
// backward adds each unit's gradient as it arrives.
//
// Each gradient's sum of squares (sum_of_squares): composite, LibTorch's float64 vector norm —
// which converts the gradient to a float64 copy first — squared; fused (kernels.fused_grad_norm),
// on CUDA one kernel reading the float32 / bf16 gradient in place with float64 squares and sums in
// an order fixed by its size (kernels/sum_squares.cu), elsewhere the composite path.
#pragma once
#include <ATen/Tensor.h>

#include <vector>

namespace ptrain {

class Collectives;

at::Tensor sum_of_squares(const at::Tensor& grad, bool fused);  // float64 [1] on grad's device

class GradNorm {
 public:
  explicit GradNorm(bool fused = false) : fused_(fused) {}
  void add(const at::Tensor& grad);  // an undefined gradient (a unit with none) adds nothing
  // The norm over everything added on every rank (collective when comm spans several ranks).
  double total(Collectives* comm);

 private:
  bool fused_;
  at::Tensor squares_;  // float64 [1] on the first gradient's device; on the CPU once total() ran
};

// Returns the global norm of `grads` before clipping; when max_norm > 0 and the norm exceeds
// it, scales every local gradient by max_norm / (norm + 1e-6).
double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives* comm = nullptr,
                      bool fused = false);

}  // namespace ptrain
