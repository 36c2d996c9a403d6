// AdamW with decoupled weight decay, the same update as torch.optim.AdamW:
//   p *= 1 - lr*wd (decayed region only); m = lerp(m, g, 1-b1); v = b2*v + (1-b2)*g^2
//   p -= lr/(1-b1^t) * m / (sqrt(v)/sqrt(1-b2^t) + eps)
// Works on flat shards: each target is one unit's 1-D master shard whose prefix
// [0, decay_numel) receives weight decay. The update runs as LibTorch's fused AdamW kernel;
// tests/unit/test_optim.cpp holds it to torch.optim.AdamW's trajectory.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "optim/optimizer.h"

namespace ptrain {

// Every field is given by the caller (the run's from [optimizer], optim/options.h, where the
// defaults are): none is defaulted here.
struct AdamWOptions {
  double beta1 = 0.0;
  double beta2 = 0.0;
  double eps = 0.0;
  double weight_decay = 0.0;
  // bf16 parameters: compute the update in float32 and round the new parameters
  // stochastically (moments round to nearest). Random bits depend on (seed, step, element's
  // global index), so runs are reproducible and resume exactly at any world size.
  bool stochastic_rounding = false;
  uint64_t seed = 0;
  // bf16 parameters: Kahan-compensated updates. A bf16 buffer per parameter keeps what rounding
  // the new parameter to nearest dropped and adds it to the next update, so small updates
  // accumulate instead of vanishing (checkpointed as "<name>.kahan_comp"). Not with
  // stochastic_rounding.
  bool kahan = false;
};

class AdamW : public Optimizer {
 public:
  AdamW(std::vector<OptimTarget> targets, AdamWOptions options);

  // exp_avg / exp_avg_sq per target, keyed "<name>.exp_avg" / "<name>.exp_avg_sq", and with
  // Kahan summation "<name>.kahan_comp".
  std::vector<OptimState> state() const override;

 protected:
  void apply(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) override;
  at::Tensor first_moment(size_t i) const override { return exp_avg_[i]; }
  at::Tensor compensation(size_t i) const override { return opt_.kahan ? comp_[i] : at::Tensor(); }

 private:
  // Stochastic rounding or Kahan summation: float32 from the moments to the new parameter
  // (torch AdamW's order of operations), then rounded as the option says.
  void update_unfused(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr);
  std::vector<at::Tensor> exp_avg_, exp_avg_sq_, comp_;
  AdamWOptions opt_;
};

}  // namespace ptrain
