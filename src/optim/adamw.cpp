#include "optim/adamw.h"

#include <ATen/ATen.h>

#include <cmath>

namespace ptrain {

AdamW::AdamW(std::vector<OptimTarget> targets, AdamWOptions options) : targets_(std::move(targets)), opt_(options) {
  for (const auto& t : targets_) {
    exp_avg_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
    exp_avg_sq_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
  }
}

void AdamW::step(double lr) {
  at::NoGradGuard no_grad;
  ++steps_;
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, static_cast<double>(steps_)));
  const double step_size = lr / bc1;
  for (size_t i = 0; i < targets_.size(); ++i) {
    const auto& t = targets_[i];
    const at::Tensor& g = t.param.grad();
    if (!g.defined()) continue;
    at::Tensor p = t.param.detach();
    if (opt_.weight_decay != 0 && t.decay_numel > 0) p.narrow(0, 0, t.decay_numel).mul_(1.0 - lr * opt_.weight_decay);
    exp_avg_[i].lerp_(g, 1.0 - opt_.beta1);
    exp_avg_sq_[i].mul_(opt_.beta2).addcmul_(g, g, 1.0 - opt_.beta2);
    at::Tensor denom = (exp_avg_sq_[i].sqrt() / bc2_sqrt).add_(opt_.eps);
    p.addcdiv_(exp_avg_[i], denom, -step_size);
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
