#include "model/loss.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <algorithm>

#include "model/gemm.h"

#ifdef PTRAIN_CUDA
#include "common/cuda_stream.h"
#include "softmax_xent_cuda.h"
#endif

namespace ptrain {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

int64_t default_loss_chunk(int64_t vocab_size) {
  // ~512 MiB of float32 logits. The output projection's gradient is summed over the chunks
  // into a [vocab, dim] float32 buffer that each chunk's GEMM reads and writes whole, so small
  // chunks make that GEMM memory-bound: Llama 3.2 1B (vocab 128256) on an H100, 4 x 2048 tokens,
  // took 0.278 s a step at 130-token chunks (64 MiB), 0.198 s at 1024 and 0.194 s at 4096,
  // for 0.5 and 3.4 GiB more peak memory.
  constexpr int64_t kChunkBytes = 512ll << 20;
  return std::max<int64_t>(64, kChunkBytes / (4 * vocab_size));
}

int64_t loss_chunk_bytes_per_logit(int64_t logits, int64_t grad, int64_t compute, bool adapter, bool fused) {
  const int64_t formed = adapter ? 4 + (logits != 4 ? logits : 0) : logits;
  const int64_t grad_beside = logits + (grad != logits ? grad : 0);
  const int64_t scored = fused ? grad_beside : std::max(2 * logits, grad_beside);
  const int64_t after = grad + (grad != compute ? compute : 0);
  return std::max({formed, scored, after});
}

XentChunk softmax_xent_reference(at::Tensor logits, const at::Tensor& targets, double scale,
                                 std::optional<c10::ScalarType> grad_dtype) {
  const at::Tensor valid = targets.ne(kIgnoreIndex);
  const at::Tensor safe = at::where(valid, targets, at::zeros_like(targets)).unsqueeze(1);
  const at::Tensor lse = at::logsumexp(logits, 1);  // reduces in float32 whatever the dtype
  const at::Tensor picked = logits.gather(1, safe).squeeze(1);
  const at::Tensor rows = (lse - picked).to(at::kFloat) * valid;
  XentChunk out{rows.sum(), at::Tensor(), rows};
  if (!grad_dtype) return out;
  // d loss / d logits = softmax - onehot(target), zero for masked rows, times scale.
  at::Tensor p = logits.sub_(lse.unsqueeze(1)).exp_();
  const at::Tensor v = valid.to(logits.scalar_type()).unsqueeze(1);
  p.scatter_add_(1, safe, -v).mul_(v * scale);
  out.grad = p.to(*grad_dtype);
  return out;
}

XentChunk softmax_xent(at::Tensor logits, const at::Tensor& targets, double scale,
                       std::optional<c10::ScalarType> grad_dtype, bool fused) {
#ifdef PTRAIN_CUDA
  auto kernel_dtype = [](c10::ScalarType t) { return t == at::kFloat || t == at::kBFloat16; };
  if (fused && logits.is_cuda() && kernel_dtype(logits.scalar_type()) && (!grad_dtype || kernel_dtype(*grad_dtype))) {
    logits = logits.contiguous();
    const at::Tensor t = targets.contiguous();
    at::Tensor row_loss = at::empty({logits.size(0)}, logits.options().dtype(at::kFloat));
    at::Tensor grad;  // in the logits' own buffer where the dtypes agree
    if (grad_dtype) grad = *grad_dtype == logits.scalar_type() ? logits : at::empty_like(logits, *grad_dtype);
    const kernels::XentShape shape{logits.size(0), logits.size(1), logits.scalar_type() == at::kBFloat16,
                                   grad_dtype == at::kBFloat16, static_cast<float>(scale)};
    kernels::softmax_xent(shape, logits.data_ptr(), t.data_ptr<int64_t>(), row_loss.data_ptr<float>(),
                          grad.defined() ? grad.data_ptr() : nullptr, cuda_stream_of(logits));
    return {row_loss.sum(), grad, row_loss};
  }
#endif
  (void)fused;
  return softmax_xent_reference(std::move(logits), targets, scale, grad_dtype);
}

namespace {

// The shared chunk loop. `grads` (when non-null) receives d(loss_sum)/d(input) times `scale`
// (1 / unmasked tokens for the mean) for the inputs it asks for. With an adapter the logits
// are h W^T + s (h A^T) B^T, never forming W + s B A.
struct ChunkGrads {
  bool hidden = false, weight = false, adapter = false;
  at::Tensor gh, gw, ga, gb;
};

// Rows of logits at a time in token_stats: its float32 temporaries are this many rows of the
// vocabulary (8 MiB each at 128k), not a chunk's.
constexpr int64_t kStatRows = 16;

// TokenStat's columns for the rows of `logits` [n, vocab] and their `targets` [n] into `out`
// [n, TokenStat::count]. The entropy is sum_v p_v (lse - z_v), a sum of terms of one sign, not
// lse - sum_v p_v z_v, which cancels where a distribution is peaked (the error then of the order
// of the largest logit's rounding). Two float32 [16, vocab] temporaries at a time (lse - z and
// p, then p (lse - z) in place, or logsumexp's) and the float32 copy of logits held in another dtype:
// token_stats_bytes.
void token_stats(const at::Tensor& logits, const at::Tensor& targets, at::Tensor out) {
  const auto vocab = static_cast<double>(logits.size(1));
  for (int64_t r = 0; r < logits.size(0); r += kStatRows) {
    const int64_t n = std::min(kStatRows, logits.size(0) - r);
    const at::Tensor x = logits.narrow(0, r, n).to(at::kFloat);
    const at::Tensor surprise = at::logsumexp(x, 1).unsqueeze(1) - x;  // -log p_v
    const at::Tensor p = surprise.neg().exp_();
    const at::Tensor log_sum_sq = at::linalg_vector_norm(p, 2, {1}).log_().mul_(2);
    // a reduction, not a BLAS dot: summed one after another in float32, a tail of 10^5 terms each
    // below half an ulp of the sum would be lost (measured: 1.5e-4 of SmolLM2's entropy)
    const at::Tensor entropy = p.mul_(surprise).sum(1);
    const at::Tensor top1 = x.argmax(1).eq(targets.narrow(0, r, n)).to(at::kFloat);  // argmax: the first largest
    out.narrow(0, r, n).copy_(at::stack({entropy, log_sum_sq, x.sum(1) / vocab, top1}, 1));
  }
}

}  // namespace

int64_t token_stats_bytes(int64_t vocab, int64_t logits_bytes) {
  return (logits_bytes == 4 ? 2 : 3) * kStatRows * vocab * 4;
}

namespace {

// `row_scale` [N] float32 (when defined) multiplies each token's gradient, after `scale`;
// `row_loss` (when non-null) receives each token's loss [N] float32; `row_stats` (when non-null)
// each token's TokenStat columns [N, TokenStat::count] float32.
at::Tensor chunked_loss_sum(const at::Tensor& hidden, const at::Tensor& weight, const OutputAdapter* adapter,
                            const at::Tensor& targets, int64_t chunk, c10::ScalarType logits_dtype, double scale,
                            ChunkGrads* grads, bool fused, const at::Tensor& row_scale = at::Tensor(),
                            at::Tensor* row_loss = nullptr, at::Tensor* row_stats = nullptr) {
  const int64_t N = hidden.size(0);
  if (chunk <= 0) chunk = default_loss_chunk(weight.size(0));
  at::Tensor total = at::zeros({}, hidden.options().dtype(at::kFloat));
  const bool lr = adapter && adapter->a.defined();
  at::Tensor a32, b32;
  if (lr) {
    a32 = adapter->a.to(at::kFloat);
    b32 = adapter->b.to(at::kFloat);
  }
  if (grads) {
    if (grads->hidden) grads->gh = at::empty_like(hidden);
    if (grads->weight) grads->gw = at::zeros(weight.sizes(), weight.options().dtype(at::kFloat));
    if (grads->adapter) {
      grads->ga = at::zeros(a32.sizes(), a32.options());
      grads->gb = at::zeros(b32.sizes(), b32.options());
    }
  }
  // d loss / d logits: in the hidden dtype for the matmuls, in float32 where the adapter needs it.
  std::optional<c10::ScalarType> grad_dtype;  // (float32 where rows are scaled after, rounded once)
  if (grads)
    grad_dtype = (lr && (grads->hidden || grads->adapter)) || row_scale.defined() ? at::kFloat : hidden.scalar_type();
  if (row_loss) *row_loss = at::empty({N}, hidden.options().dtype(at::kFloat));
  if (row_stats) *row_stats = at::empty({N, TokenStat::count}, hidden.options().dtype(at::kFloat));
  for (int64_t start = 0; start < N; start += chunk) {
    const int64_t n = std::min(chunk, N - start);
    at::Tensor h = hidden.narrow(0, start, n);
    // [n, vocab], the only one alive; float32 accumulation, rounded to logits_dtype
    at::Tensor logits;
    at::Tensor z;  // [n, rank] = h A^T (float32)
    if (lr) {      // the adapter's product summed into float32 logits in place, then rounded once
      z = gemm::mm(h, adapter->a.t(), at::kFloat);
      logits = gemm::mm(h, weight.t(), at::kFloat).addmm_(z, b32.t(), 1.0, adapter->scale).to(logits_dtype);
    } else {
      logits = gemm::mm(h, weight.t(), logits_dtype);
    }
    if (row_stats) token_stats(logits, targets.narrow(0, start, n), row_stats->narrow(0, start, n));
    XentChunk x = softmax_xent(std::move(logits), targets.narrow(0, start, n), scale, grad_dtype, fused);
    total.add_(x.loss_sum);
    if (row_loss) row_loss->narrow(0, start, n).copy_(x.row_loss);
    if (!grads) continue;
    if (row_scale.defined()) x.grad.mul_(row_scale.narrow(0, start, n).unsqueeze(1));
    const at::Tensor& p32 = x.grad;  // (float32 where the adapter reads it)
    at::Tensor pc = x.grad.to(hidden.scalar_type());
    if (grads->hidden) {
      at::Tensor gh = grads->gh.narrow(0, start, n);
      if (hidden.scalar_type() == at::kFloat && weight.scalar_type() == at::kFloat)
        at::mm_out(gh, pc, weight);
      else
        gh.copy_(gemm::mm(pc, weight, hidden.scalar_type()));
    }
    if (grads->weight) gemm::add_mm_(grads->gw, pc.t(), h);
    if (lr && (grads->hidden || grads->adapter)) {
      at::Tensor dz = at::mm(p32, b32).mul_(adapter->scale);  // [n, rank]
      if (grads->adapter) {
        grads->gb.addmm_(p32.t(), z, 1.0, adapter->scale);
        gemm::add_mm_(grads->ga, dz.t().contiguous(), h);
      }
      if (grads->hidden) {
        at::Tensor gh = grads->gh.narrow(0, start, n);
        gh.add_(at::mm(dz, a32).to(gh.scalar_type()));
      }
    }
  }
  if (grads) {
    if (grads->weight) grads->gw = grads->gw.to(weight.scalar_type());
    if (grads->adapter) {
      grads->ga = grads->ga.to(adapter->a.scalar_type());
      grads->gb = grads->gb.to(adapter->b.scalar_type());
    }
  }
  return total;
}

class LinearCrossEntropyFn : public torch::autograd::Function<LinearCrossEntropyFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& a, const at::Tensor& b, double adapter_scale,
                               const at::Tensor& targets, int64_t chunk, c10::ScalarType logits_dtype,
                               std::vector<bool> need, bool fused, bool stats) {
    const int64_t valid = targets.ne(kIgnoreIndex).sum().item<int64_t>();
    const double scale = valid > 0 ? 1.0 / static_cast<double>(valid) : 0.0;
    ChunkGrads g;
    g.hidden = need[0];
    g.weight = need[1];
    g.adapter = need[2];
    const OutputAdapter adapter{a, b, adapter_scale};
    at::Tensor per_row = at::empty({0}, hidden.options().dtype(at::kFloat));
    at::Tensor sum = chunked_loss_sum(hidden, weight, a.numel() > 0 ? &adapter : nullptr, targets, chunk, logits_dtype,
                                      scale, need[0] || need[1] || need[2] ? &g : nullptr, fused, at::Tensor(), nullptr,
                                      stats ? &per_row : nullptr);
    ctx->save_for_backward({g.gh, g.gw, g.ga, g.gb});
    ctx->mark_non_differentiable({per_row});
    return {sum * scale, per_row};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    auto saved = ctx->get_saved_variables();
    const at::Tensor& g = grad_out[0];
    auto times = [&](const at::Tensor& x) { return x.defined() ? x * g.to(x.scalar_type()) : at::Tensor(); };
    return {times(saved[0]), times(saved[1]), times(saved[2]), times(saved[3]), at::Tensor(), at::Tensor(),
            at::Tensor(),    at::Tensor(),    at::Tensor(),    at::Tensor(),    at::Tensor()};
  }
};

// logp = -(row loss); backward recomputes the chunks with each row's gradient weight: d logp /
// d logits = onehot - softmax, so the rows are scaled by minus the incoming gradient. The second
// output (empty unless `stats`) is each row's TokenStat columns, without a gradient.
class LinearTokenLogprobsFn : public torch::autograd::Function<LinearTokenLogprobsFn> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& hidden, const at::Tensor& weight,
                               const at::Tensor& a, const at::Tensor& b, double adapter_scale,
                               const at::Tensor& targets, int64_t chunk, c10::ScalarType logits_dtype, bool fused,
                               bool stats) {
    const OutputAdapter adapter{a, b, adapter_scale};
    at::Tensor rows, per_row = at::empty({0}, hidden.options().dtype(at::kFloat));
    chunked_loss_sum(hidden, weight, a.numel() > 0 ? &adapter : nullptr, targets, chunk, logits_dtype, 1.0, nullptr,
                     fused, at::Tensor(), &rows, stats ? &per_row : nullptr);
    ctx->save_for_backward({hidden, weight, a, b, targets});
    ctx->saved_data["adapter_scale"] = adapter_scale;
    ctx->saved_data["chunk"] = chunk;
    ctx->saved_data["logits_dtype"] = static_cast<int64_t>(logits_dtype);
    ctx->saved_data["fused"] = fused;
    ctx->mark_non_differentiable({per_row});
    return {rows.neg_(), per_row};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grad_out) {
    const auto saved = ctx->get_saved_variables();
    const at::Tensor &hidden = saved[0], &weight = saved[1], &a = saved[2], &b = saved[3], &targets = saved[4];
    const OutputAdapter adapter{a, b, ctx->saved_data["adapter_scale"].toDouble()};
    const bool lr = a.numel() > 0;
    ChunkGrads g;
    g.hidden = ctx->needs_input_grad(0);
    g.weight = ctx->needs_input_grad(1);
    g.adapter = lr && (ctx->needs_input_grad(2) || ctx->needs_input_grad(3));
    if (g.hidden || g.weight || g.adapter)
      chunked_loss_sum(hidden, weight, lr ? &adapter : nullptr, targets, ctx->saved_data["chunk"].toInt(),
                       static_cast<c10::ScalarType>(ctx->saved_data["logits_dtype"].toInt()), 1.0, &g,
                       ctx->saved_data["fused"].toBool(), grad_out[0].to(at::kFloat).neg());
    return {g.gh, g.gw, g.ga, g.gb, at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_tokens, c10::ScalarType logits_dtype, const OutputAdapter* adapter,
                                 bool fused, at::Tensor* stats) {
  const bool lr = adapter && adapter->a.defined();
  const at::Tensor none = at::empty({0}, weight.options().requires_grad(false));
  variable_list out = LinearTokenLogprobsFn::apply(hidden, weight, lr ? adapter->a : none, lr ? adapter->b : none,
                                                   lr ? adapter->scale : 0.0, targets, chunk_tokens, logits_dtype,
                                                   fused, stats != nullptr);
  if (stats) *stats = out[1];
  return out[0];
}

at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t chunk_tokens, c10::ScalarType logits_dtype, const OutputAdapter* adapter,
                                bool fused, at::Tensor* stats) {
  // Gradients are produced in forward only for the inputs autograd will ask about.
  const bool grad = at::GradMode::is_enabled();
  const bool lr = adapter && adapter->a.defined();
  std::vector<bool> need{grad && hidden.requires_grad(), grad && weight.requires_grad(),
                         grad && lr && (adapter->a.requires_grad() || adapter->b.requires_grad())};
  // Without an adapter, empty placeholders (autograd wants every tensor argument defined).
  const at::Tensor none = at::empty({0}, weight.options().requires_grad(false));
  variable_list out = LinearCrossEntropyFn::apply(hidden, weight, lr ? adapter->a : none, lr ? adapter->b : none,
                                                  lr ? adapter->scale : 0.0, targets, chunk_tokens, logits_dtype, need,
                                                  fused, stats != nullptr);
  if (stats) *stats = out[1];
  return out[0];
}

LossSum linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_tokens, c10::ScalarType logits_dtype, const OutputAdapter* adapter,
                                 bool fused, bool token_stats) {
  at::NoGradGuard no_grad;
  at::Tensor stats = at::empty({0}, hidden.options().dtype(at::kFloat));
  at::Tensor sum = chunked_loss_sum(hidden, weight, adapter, targets, chunk_tokens, logits_dtype, 0.0, nullptr, fused,
                                    at::Tensor(), nullptr, token_stats ? &stats : nullptr);
  LossSum r{sum.item<double>(), targets.ne(kIgnoreIndex).sum().item<int64_t>()};
  if (token_stats) {
    const at::Tensor sums = trained_token_stats(stats, targets).cpu();
    r.entropy_sum = sums[0].item<double>();
    r.top1 = sums[1].item<double>();
  }
  return r;
}

at::Tensor trained_token_stats(const at::Tensor& stats, const at::Tensor& targets) {
  const at::Tensor trained = targets.reshape({-1}).ne(kIgnoreIndex);
  const at::Tensor picked = stats.index_select(
      1, at::tensor({TokenStat::entropy, TokenStat::is_top1}, at::TensorOptions(at::kLong).device(stats.device())));
  return picked.masked_fill(trained.logical_not().unsqueeze(1), 0).to(at::kDouble).sum(0);
}

}  // namespace ptrain
