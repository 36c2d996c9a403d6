#include "optim/clip.h"

#include <ATen/ATen.h>

#include <cmath>

#include "parallel/collectives.h"

namespace ptrain {

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm, Collectives* comm) {
  std::vector<at::Tensor> defined;
  for (const auto& g : grads)
    if (g.defined()) defined.push_back(g);
  at::Tensor sq = at::zeros({1}, at::kDouble);
  if (!defined.empty()) {
    // Accumulate in float64: a float32 norm over a multi-million-element shard is off by up to
    // ~4e-4 relative here, which made the clip factor (and so training) depend on the sharding.
    std::vector<at::Tensor> norms;
    for (const auto& g : defined) norms.push_back(at::linalg_vector_norm(g, 2, {}, false, at::kDouble));
    sq += at::stack(norms).pow(2).sum().cpu();
  }
  if (comm && comm->world_size() > 1) comm->all_reduce_sum(sq);
  const double total = std::sqrt(sq.item<double>());
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0)
      for (const auto& g : defined) g.mul_(coef);
  }
  return total;
}

}  // namespace ptrain
