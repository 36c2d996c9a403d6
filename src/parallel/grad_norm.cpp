#include "parallel/grad_norm.h"

#include <ATen/ATen.h>

#include <cmath>

#include "parallel/collectives.h"

namespace ptrain {

void GradNorm::add(const at::Tensor& grad) {
  if (!grad.defined()) return;
  // Summed where the gradients are: one copy to the host in total(), not a synchronisation per unit.
  if (!squares_.defined()) squares_ = at::zeros({1}, grad.options().dtype(at::kDouble));
  squares_ += at::linalg_vector_norm(grad, 2, {}, false, at::kDouble).pow(2).to(squares_.device());
}

double GradNorm::total(Collectives* comm) {
  squares_ = squares_.defined() ? squares_.cpu() : at::zeros({1}, at::kDouble);
  if (comm && comm->world_size() > 1) comm->all_reduce_sum(squares_);
  return std::sqrt(squares_.item<double>());
}

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives* comm) {
  GradNorm norm;
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
