#include "optim/clip.h"

#include <ATen/ATen.h>

namespace ptrain {

double clip_grad_norm(const std::vector<at::Tensor>& grads, double max_norm) {
  std::vector<at::Tensor> norms;
  for (const auto& g : grads)
    if (g.defined()) norms.push_back(at::linalg_vector_norm(g.to(at::kFloat), 2));
  if (norms.empty()) return 0.0;
  const double total = at::linalg_vector_norm(at::stack(norms), 2).item<double>();
  if (max_norm > 0) {
    const double coef = max_norm / (total + 1e-6);
    if (coef < 1.0)
      for (const auto& g : grads)
        if (g.defined()) g.mul_(coef);
  }
  return total;
}

}  // namespace ptrain
