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
  TORCH_CHECK(!(opt_.kahan && opt_.stochastic_rounding), "Kahan summation and stochastic rounding exclude each other");
  weight_decay_ = opt_.weight_decay;
  for (const auto& t : targets_) {
    exp_avg_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
    exp_avg_sq_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
    if (opt_.kahan) comp_.push_back(at::zeros_like(t.param, at::MemoryFormat::Contiguous).detach());
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

void Optimizer::update(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  if (!counting_ || grads.empty()) return apply(grads, lr);
  at::NoGradGuard no_grad;
  std::vector<at::Tensor> before, comp_before;
  for (const auto& [i, g] : grads) {
    before.push_back(targets_[i].param.detach().clone());
    const at::Tensor c = compensation(i);
    comp_before.push_back(c.defined() ? c.clone() : c);
  }
  apply(grads, lr);
  if (!counts_.defined()) counts_ = at::zeros({2}, before[0].options().dtype(at::kLong));
  for (size_t k = 0; k < grads.size(); ++k) {
    const OptimTarget& t = targets_[grads[k].first];
    at::Tensor computed = first_moment(grads[k].first).ne(0);
    if (weight_decay_ != 0 && t.decay_numel > 0)
      computed.narrow(0, 0, t.decay_numel).logical_or_(before[k].narrow(0, 0, t.decay_numel).ne(0));
    at::Tensor kept = t.param.detach().eq(before[k]);
    if (comp_before[k].defined()) kept.logical_and_(compensation(grads[k].first).eq(comp_before[k]));
    counts_[0] += computed.sum();
    counts_[1] += computed.logical_and_(kept).sum();
  }
}

UpdateCounts Optimizer::take_update_counts() {
  if (!counts_.defined()) return {};
  const UpdateCounts c{counts_[0].item<int64_t>(), counts_[1].item<int64_t>()};
  counts_.zero_();
  return c;
}

void AdamW::apply(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  at::NoGradGuard no_grad;
  if (opt_.stochastic_rounding || opt_.kahan) return update_unfused(grads, lr);
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

// The CPU reference; on CUDA stochastic rounding runs as one fused kernel (kernels/adamw_sr.cu).
void AdamW::update_unfused(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  const double bc1 = 1.0 - std::pow(opt_.beta1, static_cast<double>(steps_));
  const double bc2_sqrt = std::sqrt(1.0 - std::pow(opt_.beta2, static_cast<double>(steps_)));
  const uint64_t step_seed = sr::step_seed(opt_.seed, steps_);
  for (const auto& [i, grad] : grads) {
    const auto& t = targets_[i];
    if (opt_.stochastic_rounding && t.param.is_cuda() && t.param.scalar_type() == at::kBFloat16 &&
        exp_avg_[i].scalar_type() == at::kBFloat16) {
#ifdef PTRAIN_CUDA
      at::Tensor g = grad.to(at::kBFloat16).contiguous();
      auto bits = [](const at::Tensor& x) { return reinterpret_cast<uint16_t*>(x.data_ptr<at::BFloat16>()); };
      kernels::AdamWSrShard k{bits(t.param),
                              bits(g),
                              bits(exp_avg_[i]),
                              bits(exp_avg_sq_[i]),
                              t.param.numel(),
                              opt_.weight_decay != 0 ? t.decay_numel : 0,
                              static_cast<float>(opt_.beta2),
                              static_cast<float>(1.0 - opt_.beta1),
                              static_cast<float>(1.0 - opt_.beta2),
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
    const at::Tensor old = opt_.kahan ? p.clone() : at::Tensor();
    if (opt_.weight_decay != 0 && t.decay_numel > 0) p.narrow(0, 0, t.decay_numel).mul_(1.0 - lr * opt_.weight_decay);
    p.addcdiv_(m, (v.sqrt() / bc2_sqrt).add_(opt_.eps), -lr / bc1);
    if (opt_.kahan) {
      // The update (decay included) plus what the last rounding dropped, added to the old
      // value and rounded to nearest; what this rounding drops is kept for the next step.
      const at::Tensor y = p.sub_(old).add_(comp_[i].to(at::kFloat));  // the compensated update
      const at::Tensor stored = (old + y).to(t.param.scalar_type());
      comp_[i].copy_(y.sub_(stored.to(at::kFloat).sub_(old)));
      t.param.detach().copy_(stored);
    } else {
      t.param.detach().copy_(stochastic_round_bf16(p, step_seed, t.global_offset));
    }
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
    if (opt_.kahan) out.push_back({targets_[i].name + ".kahan_comp", i, comp_[i], elementwise});
  }
  return out;
}

}  // namespace ptrain
