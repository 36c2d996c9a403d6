#include "parallel/grad_norm.h"

#include <ATen/ATen.h>

#include <cmath>

#include "parallel/collectives.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>

#include "sum_squares_cuda.h"
#endif

namespace ptrain {

at::Tensor sum_of_squares(const at::Tensor& grad, bool fused) {
#ifdef PTRAIN_CUDA
  const auto dtype = grad.scalar_type();
  if (fused && grad.is_cuda() && (dtype == at::kFloat || dtype == at::kBFloat16)) {
    const at::Tensor g = grad.contiguous();
    const auto options = g.options().dtype(at::kDouble);
    at::Tensor scratch = at::empty({kernels::kSumSquaresBlocks}, options), out = at::empty({1}, options);
    kernels::sum_squares_f64(g.data_ptr(), g.numel(), dtype == at::kBFloat16, scratch.data_ptr<double>(),
                             out.data_ptr<double>(), at::cuda::getCurrentCUDAStream(g.device().index()).stream());
    return out;
  }
#endif
  return at::linalg_vector_norm(grad, 2, {}, false, at::kDouble).pow(2).reshape({1});
}

void GradNorm::add(const at::Tensor& grad) {
  if (!grad.defined()) return;
  // Summed where the gradients are: one copy to the host in total(), not a synchronisation per unit.
  if (!squares_.defined()) squares_ = at::zeros({1}, grad.options().dtype(at::kDouble));
  squares_ += sum_of_squares(grad, fused_).to(squares_.device());
}

double GradNorm::total(Collectives* comm) {
  squares_ = squares_.defined() ? squares_.cpu() : at::zeros({1}, at::kDouble);
  if (comm && comm->world_size() > 1) comm->all_reduce_sum(squares_);
  return std::sqrt(squares_.item<double>());
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives* comm, bool fused) {
  GradNorm norm(fused);
  for (const auto& g : grads) norm.add(g);
  const double total = norm.total(comm);
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0)
      for (const auto& g : grads)
        if (g.defined()) g.mul_(coef);
  }
  return total;
}

}  // namespace ptrain
