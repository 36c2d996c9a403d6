#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

#include "optim/stochastic_round.h"


namespace ptrain {

AdamW::AdamW(std::vector<OptimTarget> targets, AdamWOptions options) : targets_(std::move(targets)), opt_(options) {
  for (const auto& t : targets_) {
    exp_avg_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
    exp_avg_sq_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
  }
}

void AdamW::step(double lr) {
  begin_step();
  std::vector<std::pair<size_t, at::Tensor>> ready;
  for (size_t i = 0; i < targets_.size(); ++i)
    if (targets_[i].param.grad().defined()) ready.emplace_back(i, targets_[i].param.grad());
  update(ready, lr);
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

void AdamW::update_stochastic(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, static_cast<double>(steps_)));
  const uint64_t step_seed = opt_.seed ^ (0xA24BAED4963EE407ull * static_cast<uint64_t>(steps_));
  for (const auto& [i, grad] : grads) {
    const auto& t = targets_[i];
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

std::vector<std::pair<std::string, at::Tensor>> AdamW::state() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (size_t i = 0; i < targets_.size(); ++i) {
    out.emplace_back(targets_[i].name + ".exp_avg", exp_avg_[i]);
    out.emplace_back(targets_[i].name + ".exp_avg_sq", exp_avg_sq_[i]);
  }
  return out;
}

int64_t AdamW::state_bytes() const {
  int64_t n = 0;
  for (size_t i = 0; i < targets_.size(); ++i) n += exp_avg_[i].nbytes() + exp_avg_sq_[i].nbytes();
  return n;
}

}  // namespace ptrain
