#include "model/loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include "model/gemm.h"

namespace ptrain {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t default_loss_chunk(int64_t vocab_size) {
  constexpr int64_t kChunkBytes = 64ll << 20;
  return std::max<int64_t>(64, kChunkBytes / (4 * vocab_size));
}

namespace {

// The shared chunk loop. With grads != nullptr also writes d(loss_sum)/d(hidden) and
// d(loss_sum)/d(weight) scaled by `scale` (1 / unmasked tokens for the mean).
at::Tensor chunked_loss_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                            int64_t chunk, c10::ScalarType logits_dtype, double scale, at::Tensor* grad_hidden,
                            at::Tensor* grad_weight) {
  const int64_t N = hidden.size(0);
  if (chunk <= 0) chunk = default_loss_chunk(weight.size(0));
  at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
  at::Tensor gw;
  if (grad_hidden) {
    *grad_hidden = at::empty_like(hidden);
    gw = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
  }
  for (int64_t start = 0; start < N; start += chunk) {
    const int64_t n = std::min(chunk, N - start);
    at::Tensor h = hidden.narrow(0, start, n);
    at::Tensor t = targets.narrow(0, start, n);
    at::Tensor valid = t.ne(kIgnoreIndex);
    at::Tensor safe = at::where(valid, t, at::zeros_like(t)).unsqueeze(1);
    // [n, vocab], the only one alive; float32 accumulation, rounded to logits_dtype
    at::Tensor logits = gemm::mm(h, weight.t(), logits_dtype);
    at::Tensor lse = at::logsumexp(logits, 1);  // reduces in float32 whatever the dtype
    at::Tensor picked = logits.gather(1, safe).squeeze(1);
    total.add_(((lse - picked).to(at::kFloat) * valid).sum());
    if (!grad_hidden) continue;
    // d loss / d logits = softmax - onehot(target), zero for masked rows, times scale.
    at::Tensor p = logits.sub_(lse.unsqueeze(1)).exp_();
    at::Tensor v = valid.to(logits_dtype).unsqueeze(1);
    p.scatter_add_(1, safe, -v).mul_(v * scale);
    at::Tensor pc = p.to(hidden.scalar_type());
    at::Tensor gh = grad_hidden->narrow(0, start, n);
    if (hidden.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat) {
      at::mm_out(gh, pc, weight);
      gw.addmm_(pc.t(), h);
    } else {
      gh.copy_(gemm::mm(pc, weight, hidden.scalar_type()));
      gw.add_(gemm::mm(pc.t(), h, at::kFloat));
    }
  }
  if (grad_weight) *grad_weight = gw.to(weight.scalar_type());
  return total;
}

class LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                            const at::Tensor& targets, int64_t chunk, c10::ScalarType logits_dtype, bool need) {
    const int64_t valid = targets.ne(kIgnoreIndex).sum().item<int64_t>();
    const double scale = valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0;
    at::Tensor gh, gw;
    at::Tensor sum = chunked_loss_sum(hidden, weight, targets, chunk, logits_dtype, scale, need ? &gh : nullptr,
                                      need ? &gw : nullptr);
    ctx->save_for_backward({gh, gw});
    return sum * scale;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grad_out[0];
    at::Tensor gh = saved[0].defined() ? saved[0] * g.to(saved[0].scalar_type()) : at::Tensor();
    at::Tensor gw = saved[1].defined() ? saved[1] * g.to(saved[1].scalar_type()) : at::Tensor();
    return {gh, gw, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t chunk_tokens, c10::ScalarType logits_dtype) {
  // Gradients are produced in forward only when autograd will ask for them.
  const bool need = at::GradMode::is_enabled() && (hidden.requires_grad() || weight.requires_grad());
  return LinearCrossEntropyFn::apply(hidden, weight, targets, chunk_tokens, logits_dtype, need);
}

LossSum linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_tokens, c10::ScalarType logits_dtype) {
  at::NoGradGuard no_grad;
  at::Tensor sum = chunked_loss_sum(hidden, weight, targets, chunk_tokens, logits_dtype, 0.0, nullptr, nullptr);
  return {sum.item<double>(), targets.ne(kIgnoreIndex).sum().item<int64_t>()};
}

}  // namespace ptrain
