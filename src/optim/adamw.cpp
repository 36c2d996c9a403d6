#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "optim/sr_bits.h"
#include "optim/stochastic_round.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>

#include "adamw_sr_cuda.h"
#endif

namespace ptrain {

AdamW::AdamW(std::vector<OptimTarget> targets, AdamWOptions options) : Optimizer(std::move(targets)), opt_(options) {
  for (const auto& t : targets_) {
    exp_avg_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
    exp_avg_sq_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
  }
}

void Optimizer::step(double lr) {
  begin_step();
  std::vector<std::pair<size_t, at::Tensor>> ready;
  for (size_t i = 0; i < targets_.size(); ++i)
    if (targets_[i].param.grad().defined()) ready.emplace_back(i, targets_[i].param.grad());
  update(ready, lr);
}

int64_t Optimizer::state_bytes() const {
  int64_t n = 0;
  for (const auto& s : state()) n += static_cast<int64_t>(s.tensor.nbytes());
  return n;
}

void AdamW::update(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  at::NoGradGuard no_grad;
  if (opt_.stochastic_rounding) return update_stochastic(grads, lr);
  // One fused pass per weight-decay class (LibTorch's _fused_adamw_, the kernel behind
  // torch.optim.AdamW(fused=True), on CPU and CUDA): the decayed prefix of every shard, then
  // the rest with weight_decay 0.
  std::vector<at::Tensor> p[2], g[2], m[2], v[2], t[2];
  for (const auto& [i, grad] : grads) {
    const auto& tg = targets_[i];
    const int64_t n = tg.param.numel(), split[2] = {0, tg.decay_numel};
    for (int cls = 0; cls < 2; ++cls) {
      const int64_t begin = cls == 0 ? 0 : split[1], len = cls == 0 ? split[1] : n - split[1];
      if (len == 0) continue;
      p[cls].push_back(tg.param.detach().narrow(0, begin, len));
      g[cls].push_back(grad.narrow(0, begin, len));
      m[cls].push_back(exp_avg_[i].narrow(0, begin, len));
      v[cls].push_back(exp_avg_sq_[i].narrow(0, begin, len));
    }
  }
  for (int cls = 0; cls < 2; ++cls) {
    if (p[cls].empty()) continue;
    // The kernel reads the (already incremented) step count from one float tensor per param.
    at::Tensor step = at::full({}, static_cast<double>(steps_), p[cls][0].options().dtype(at::kFloat));
    t[cls].assign(p[cls].size(), step);
    at::_fused_adamw_(p[cls], g[cls], m[cls], v[cls], /*max_exp_avg_sqs=*/{}, t[cls], lr, opt_.beta1, opt_.beta2,
                      cls == 0 ? opt_.weight_decay : 0.0, opt_.eps, /*amsgrad=*/false, /*maximize=*/false);
  }
}

// The CPU reference; on CUDA the same update runs as one fused kernel (kernels/adamw_sr.cu).
void AdamW::update_stochastic(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, static_cast<double>(steps_)));
  const uint64_t step_seed = sr::step_seed(opt_.seed, steps_);
  for (const auto& [i, grad] : grads) {
    const auto& t = targets_[i];
    if (t.param.is_cuda() && t.param.scalar_type() == at::kBFloat16 && exp_avg_[i].scalar_type() == at::kBFloat16) {
#ifdef PTRAIN_CUDA
      at::Tensor g = grad.to(at::kBFloat16).contiguous();
      auto bits = [](const at::Tensor& x) { return reinterpret_cast<uint16_t*>(x.data_ptr<at::BFloat16>()); };
      kernels::AdamWSrShard k{bits(t.param),
                              bits(g),
                              bits(exp_avg_[i]),
                              bits(exp_avg_sq_[i]),
                              t.param.numel(),
                              opt_.weight_decay != 0 ? t.decay_numel : 0,
                              static_cast<float>(opt_.beta1),
                              static_cast<float>(opt_.beta2),
                              static_cast<float>(opt_.eps),
                              static_cast<float>(1.0 - lr * opt_.weight_decay),
                              static_cast<float>(lr / bc1),
                              static_cast<float>(bc2_sqrt),
                              step_seed,
                              t.global_offset};
      kernels::adamw_bf16_sr_step(k, at::cuda::getCurrentCUDAStream(t.param.device().index()).stream());
      continue;
#endif
    }
    // The same update as torch AdamW, in float32 (the reference order of operations).
    at::Tensor g = grad.to(at::kFloat);
    at::Tensor m = exp_avg_[i].to(at::kFloat).lerp_(g, 1.0 - opt_.beta1);
    at::Tensor v = exp_avg_sq_[i].to(at::kFloat).mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    at::Tensor p = t.param.detach().to(at::kFloat);
    if (opt_.weight_decay != 0 && t.decay_numel > 0) p.narrow(0, 0, t.decay_numel).mul_(1.0 - lr * opt_.weight_decay);
    p.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(opt_.eps), -lr / bc1);
    t.param.detach().copy_(stochastic_round_bf16(p, step_seed, t.global_offset));
    exp_avg_[i].copy_(m);
    exp_avg_sq_[i].copy_(v);
  }
}

std::vector<OptimState> AdamW::state() const {
  std::vector<OptimState> out;
  auto elementwise = [](int64_t e) { return e; };
  for (size_t i = 0; i < targets_.size(); ++i) {
    out.push_back({targets_[i].name + ".exp_avg", i, exp_avg_[i], elementwise});
    out.push_back({targets_[i].name + ".exp_avg_sq", i, exp_avg_sq_[i], elementwise});
  }
  return out;
}

}  // namespace ptrain
