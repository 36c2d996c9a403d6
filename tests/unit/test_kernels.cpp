// The fused kernels' CPU references against the composite LibTorch path they replace (bit for
// bit), and the CUDA kernels against their references (on a GPU; skipped elsewhere, saying so).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <cmath>

#include "checkpoint/hf.h"
#include "model/loss.h"
#include "model/rope.h"
#include "model/swiglu.h"
#include "parallel/fsdp.h"
#include "parallel/grad_norm.h"
#include "parallel/weights.h"
#include "test_util.h"

using namespace ptrain;

namespace {

// gate and up of odd sizes, as the model has them: the two halves of one gate/up output, or
// tensors of their own (an adapter added to each).
struct SwigluInputs {
  at::Tensor gate_up, gate, up, grad;
};
SwigluInputs swiglu_inputs(at::ScalarType dtype, bool halves, const at::Device& device = at::kCPU) {
  SwigluInputs in;
  const int64_t F = 37;
  in.gate_up = (at::randn({3, 7, 2 * F}) * 3).to(dtype).to(device).requires_grad_(true);
  if (halves) {
    auto parts = in.gate_up.chunk(2, -1);
    in.gate = parts[0], in.up = parts[1];
  } else {
    in.gate = (in.gate_up.narrow(-1, 0, F) * 1).contiguous();
    in.up = (in.gate_up.narrow(-1, F, F) + 0.5).contiguous();
  }
  in.grad = at::randn({3, 7, F}).to(dtype).to(device);
  return in;
}

}  // namespace

// On the CPU the fused SwiGLU runs its reference: the composite path's own operations, so its
// output and every gradient equal autograd of silu(gate) * up bit for bit, in float32 and bf16.
TEST(Kernels, FusedSwigluReferenceIsTheCompositePath) {
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (bool halves : {true, false}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (halves ? " halves" : " own tensors"));
      at::manual_seed(3);
      SwigluInputs a = swiglu_inputs(dtype, halves);
      at::manual_seed(3);
      SwigluInputs b = swiglu_inputs(dtype, halves);
      const at::Tensor composite = swiglu(a.gate, a.up, /*fused=*/false);
      const at::Tensor fused = swiglu(b.gate, b.up, /*fused=*/true);
      EXPECT_TRUE(at::equal(composite, fused));
      composite.backward(a.grad);
      fused.backward(b.grad);
      EXPECT_TRUE(at::equal(a.gate_up.grad(), b.gate_up.grad()));
      EXPECT_GT(a.gate_up.grad().abs().sum().item<double>(), 0.0);
    }
}

// The model with each model fusion (kernels.fused_swiglu, kernels.fused_rope, kernels.fused_loss,
// all three) trains the same: loss and every shard gradient equal to the composite path's, with
// and without activation checkpointing, on plain rows and on packed documents (RoPE's per-token
// tables).
TEST(Kernels, FusedModelGivesTheSameLossAndGradients) {
  const std::string dir = test::fixture("hf_tiny");
  const LlamaShape shape = read_hf_config(dir);
  HfCheckpoint ckpt(dir);
  at::manual_seed(5);
  const at::Tensor tokens = at::randint(0, shape.vocab_size, {2, 19}, at::kLong);
  const at::Tensor in = tokens.narrow(1, 0, 18), tgt = tokens.narrow(1, 1, 18);
  const at::Tensor docs = at::cat({at::zeros({2, 7}, at::kLong), at::ones({2, 11}, at::kLong)}, 1);
  auto run = [&](const KernelOptions& kernels, bool checkpointing, const at::Tensor& doc_ids) {
    FsdpOptions o;
    o.memory.activation_checkpointing = checkpointing ? Checkpointing::full : Checkpointing::none;
    o.kernels = kernels;
    FsdpModel model(test::plan(shape), PrecisionPolicy{}, at::kCPU, test::local_comm(), o);
    load_weights(model, ckpt.by_name());
    at::Tensor loss = model.forward_loss(in, tgt, 7, doc_ids);
    loss.backward();
    std::vector<at::Tensor> out{loss.detach()};
    for (const auto& u : model.units(UnitRole::base)) out.push_back(u.shard.grad().clone());
    return out;
  };
  const KernelOptions none{false, false, false, false};
  KernelOptions swiglu_only = none, rope_only = none, loss_only = none, all = none;
  swiglu_only.fused_swiglu = all.fused_swiglu = true;
  rope_only.fused_rope = all.fused_rope = true;
  loss_only.fused_loss = all.fused_loss = true;
  for (bool checkpointing : {false, true})
    for (bool packed : {false, true}) {
      const at::Tensor doc_ids = packed ? docs : at::Tensor();
      const std::vector<at::Tensor> want = run(none, checkpointing, doc_ids);
      for (const auto& [name, kernels] :
           {std::pair{"swiglu", swiglu_only}, {"rope", rope_only}, {"loss", loss_only}, {"all", all}}) {
        SCOPED_TRACE(std::string(name) + (checkpointing ? ", checkpointing" : "") + (packed ? ", packed" : ""));
        const std::vector<at::Tensor> got = run(kernels, checkpointing, doc_ids);
        ASSERT_EQ(got.size(), want.size());
        for (size_t i = 0; i < got.size(); ++i) EXPECT_TRUE(at::equal(got[i], want[i])) << (i ? "unit " : "loss ") << i;
      }
    }
}

// The CUDA kernels against the reference: float32 within 2e-6 relative (expf against the CPU's
// exp), bfloat16 within one bfloat16 rounding of the float32 result (the kernel rounds once, the
// composite path after each operation).
TEST(Kernels, FusedSwigluCudaMatchesReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (bool halves : {true, false}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + (halves ? " halves" : " own tensors"));
      at::manual_seed(7);
      SwigluInputs x = swiglu_inputs(dtype, halves, at::kCUDA);
      at::NoGradGuard no_grad;
      const at::Tensor g32 = x.gate.cpu().to(at::kFloat), u32 = x.up.cpu().to(at::kFloat);
      const at::Tensor dy32 = x.grad.cpu().to(at::kFloat);
      const at::Tensor want = swiglu_forward_reference(g32, u32);
      const auto [want_dg, want_du] = swiglu_backward_reference(dy32, g32, u32);
      const at::Tensor got = swiglu_forward(x.gate, x.up).cpu().to(at::kFloat);
      const auto [dg, du] = swiglu_backward(x.grad, x.gate, x.up);
      const double rtol = dtype == at::kFloat ? 2e-6 : 1.0 / 128;
      const double atol = dtype == at::kFloat ? 1e-6 : 1e-2;
      EXPECT_TRUE(at::allclose(got, want, rtol, atol));
      EXPECT_TRUE(at::allclose(dg.cpu().to(at::kFloat), want_dg, rtol, atol));
      EXPECT_TRUE(at::allclose(du.cpu().to(at::kFloat), want_du, rtol, atol));
    }
}

// The gradient norm's sum of squares, fused or composite, is the float64 sum of the float64
// squares (closed form, summed here in order) within the bound of float64 summation in any order,
// n * 2^-53 relative (the squares are positive), for float32 and bf16 gradients of odd sizes; on
// the CPU the fused switch runs the composite path, bit for bit.
TEST(Kernels, FusedGradNormIsTheFloat64SumOfSquares) {
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (int64_t n : {1, 255, 257, 100003}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " n " + std::to_string(n));
      at::manual_seed(n);
      const at::Tensor g = (at::randn({n}) * 1e3).to(dtype);
      const at::Tensor d = g.to(at::kDouble);
      const double* p = d.data_ptr<double>();
      double want = 0;
      for (int64_t i = 0; i < n; ++i) want += p[i] * p[i];
      const at::Tensor fused = sum_of_squares(g, true), composite = sum_of_squares(g, false);
      EXPECT_TRUE(at::equal(fused, composite));
      const double bound = static_cast<double>(n) * 0x1p-53;
      EXPECT_NEAR(fused.item<double>(), want, bound * want);
      GradNorm norm(true);
      norm.add(g);
      norm.add(at::Tensor());  // a unit without a gradient adds nothing
      EXPECT_NEAR(norm.total(nullptr), std::sqrt(want), bound * std::sqrt(want));
    }
}

// The CUDA kernel against the float64 sum of the float64 squares (within n * 2^-53 relative: only
// the order of the float64 sums differs), the same bits on every run, float32 and bf16 of odd sizes.
TEST(Kernels, FusedGradNormCudaMatchesReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (int64_t n : {1, 255, 257, (1 << 20) + 7, 50000003}) {
      SCOPED_TRACE(std::string(c10::toString(dtype)) + " n " + std::to_string(n));
      at::manual_seed(n);
      const at::Tensor g = (at::randn({n}, at::TensorOptions().device(at::kCUDA)) * 1e3).to(dtype);
      const double want = g.cpu().to(at::kDouble).square().sum().item<double>();
      const at::Tensor a = sum_of_squares(g, true), b = sum_of_squares(g, true);
      EXPECT_TRUE(a.is_cuda());
      EXPECT_NEAR(a.item<double>(), want, static_cast<double>(n) * 0x1p-53 * want);
      EXPECT_TRUE(at::equal(a, b)) << "not deterministic";
    }
}

namespace {

// RoPE's inputs as the model has them: q as a view of the q/k/v output (rows further apart than
// one row of heads) or a tensor of its own, odd batch, length and head count; the tables of plain
// rows ([1, T, 1, D/2]) or of packed documents ([B, T, 1, D/2], a position per token).
struct RopeInputs {
  at::Tensor qkv, x, cos, sin, grad;
};
RopeInputs rope_inputs(at::ScalarType dtype, bool view, bool packed, const at::Device& device = at::kCPU) {
  const int64_t B = 3, T = 7, H = 5, D = 12;
  RopeInputs in;
  in.qkv = (at::randn({B, T, H * D + 2 * D}) * 2).to(dtype).to(device).requires_grad_(true);
  at::Tensor q = in.qkv.narrow(-1, 0, H * D);
  in.x = (view ? q : q * 1).reshape({B, T, H, D});
  const at::Tensor angle = at::rand({packed ? B : 1, T, 1, D / 2}) * 20;
  in.cos = angle.cos().to(device);
  in.sin = angle.sin().to(device);
  in.grad = at::randn({B, T, H, D}).to(dtype).to(device);
  return in;
}

}  // namespace

// On the CPU the fused RoPE runs its reference: the composite path's own operations, so its
// output and the gradient equal autograd of the composite path bit for bit (float32, bf16; plain
// and packed tables; x a view or a tensor of its own) — and rotating back undoes the rotation
// (closed form: the rotation is orthogonal) within float32 rounding.
TEST(Kernels, FusedRopeReferenceIsTheCompositePath) {
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (bool view : {true, false})
      for (bool packed : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + (view ? " view" : " own tensor") + (packed ? " packed" : ""));
        at::manual_seed(11);
        RopeInputs a = rope_inputs(dtype, view, packed);
        at::manual_seed(11);
        RopeInputs b = rope_inputs(dtype, view, packed);
        const at::Tensor composite = rope_rotate(a.x, a.cos, a.sin, /*fused=*/false);
        const at::Tensor fused = rope_rotate(b.x, b.cos, b.sin, /*fused=*/true);
        EXPECT_TRUE(at::equal(composite, fused));
        composite.backward(a.grad);
        fused.backward(b.grad);
        EXPECT_TRUE(at::equal(a.qkv.grad(), b.qkv.grad()));
        EXPECT_GT(a.qkv.grad().abs().sum().item<double>(), 0.0);
        if (dtype == at::kFloat) {
          at::NoGradGuard no_grad;
          const at::Tensor back =
              rope_backward_reference(rope_forward_reference(a.x, a.cos, a.sin), a.cos, a.sin, dtype);
          EXPECT_TRUE(at::allclose(back, a.x, 1e-5, 1e-5));
        }
      }
}

// The CUDA kernel against the reference, bit for bit: both rotate in float32 with each product
// and sum rounded on its own and round to the element type once (float32 and bf16; plain and
// packed tables; x a view or a tensor of its own).
TEST(Kernels, FusedRopeCudaMatchesReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  for (auto dtype : {at::kFloat, at::kBFloat16})
    for (bool view : {true, false})
      for (bool packed : {false, true}) {
        SCOPED_TRACE(std::string(c10::toString(dtype)) + (view ? " view" : " own tensor") + (packed ? " packed" : ""));
        at::manual_seed(13);
        RopeInputs x = rope_inputs(dtype, view, packed, at::kCUDA);
        at::NoGradGuard no_grad;
        const at::Tensor xc = x.x.cpu(), cc = x.cos.cpu(), sc = x.sin.cpu(), gc = x.grad.cpu();
        EXPECT_TRUE(at::equal(rope_forward(x.x, x.cos, x.sin).cpu(), rope_forward_reference(xc, cc, sc)));
        EXPECT_TRUE(
            at::equal(rope_backward(x.grad, x.cos, x.sin, dtype).cpu(), rope_backward_reference(gc, cc, sc, dtype)));
      }
}

namespace {

// A chunk of logits as the loss head has them: odd rows and vocabulary, a spread like a trained
// model's (a few large logits), some rows masked.
struct XentInputs {
  at::Tensor logits, targets;
};
XentInputs xent_inputs(at::ScalarType dtype, const at::Device& device = at::kCPU) {
  const int64_t n = 37, V = 1031;
  XentInputs in;
  in.logits = (at::randn({n, V}) * 4 + at::randn({1, V}) * 2).to(dtype).to(device);
  in.targets = at::randint(0, V, {n}, at::kLong);
  in.targets.index_put_({at::arange(0, n, 5)}, kIgnoreIndex);
  in.targets = in.targets.to(device);
  return in;
}

// The closed form in float64 of the logits as given (bf16 ones widened exactly): loss = -sum of
// log_softmax at the targets of unmasked rows; gradient = (softmax - onehot) * scale on unmasked
// rows, 0 on masked ones.
struct XentClosedForm {
  double loss = 0;
  at::Tensor grad;  // float64, on the CPU
};
XentClosedForm xent_closed_form(const XentInputs& x, double scale) {
  const at::Tensor logits = x.logits.cpu().to(at::kDouble), targets = x.targets.cpu();
  const at::Tensor valid = targets.ne(kIgnoreIndex);
  const at::Tensor safe = at::where(valid, targets, at::zeros_like(targets));
  const at::Tensor logp = at::log_softmax(logits, 1);
  XentClosedForm out;
  out.loss = -(logp.gather(1, safe.unsqueeze(1)).squeeze(1) * valid).sum().item<double>();
  out.grad =
      (logp.exp() - at::one_hot(safe, logits.size(1)).to(at::kDouble)) * valid.unsqueeze(1).to(at::kDouble) * scale;
  return out;
}

}  // namespace

// The loss head's chunk against the closed form: float32 logits within float32 rounding; on the
// CPU the fused switch is the reference, bit for bit.
TEST(Kernels, FusedLossChunkIsSoftmaxMinusOnehot) {
  at::manual_seed(17);
  const XentInputs x = xent_inputs(at::kFloat);
  const double scale = 1.0 / 29;
  const XentClosedForm want = xent_closed_form(x, scale);
  const XentChunk ref = softmax_xent_reference(x.logits.clone(), x.targets, scale, at::kFloat);
  EXPECT_NEAR(ref.loss_sum.item<double>(), want.loss, 1e-6 * want.loss);
  EXPECT_TRUE(at::allclose(ref.grad.to(at::kDouble), want.grad, 1e-5, 1e-9));
  const XentChunk fused = softmax_xent(x.logits.clone(), x.targets, scale, at::kFloat, /*fused=*/true);
  EXPECT_TRUE(at::equal(fused.loss_sum, ref.loss_sum));
  EXPECT_TRUE(at::equal(fused.grad, ref.grad));
  const XentChunk loss_only = softmax_xent(x.logits.clone(), x.targets, scale, std::nullopt, true);
  EXPECT_TRUE(at::equal(loss_only.loss_sum, ref.loss_sum));
  EXPECT_FALSE(loss_only.grad.defined());
}

// The CUDA kernel against the float64 closed form of the logits it is given: the kernel reads
// float32 or bf16 logits and computes in float32 (the log-sum-exp of a row included), so the loss
// is within 1e-5 relative and a float32 gradient within 1e-5 relative (or 1e-6 * scale absolute)
// in either dtype, a bf16 gradient within one bf16 rounding; the gradient in its own buffer and in the logits' (same
// dtype), and the loss alone. (Not against softmax_xent_reference for bf16 logits: that composite
// path rounds each row's log-sum-exp to bf16 — a loss off by up to half a bf16 step of it per
// row, 0.03 at a log-sum-exp of 8 — which the first H200 run showed as a 5e-5 relative loss
// difference.)
TEST(Kernels, FusedLossCudaMatchesClosedForm) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  const double scale = 1.0 / 29;
  for (auto logits_dtype : {at::kFloat, at::kBFloat16})
    for (std::optional<c10::ScalarType> grad_dtype :
         {std::optional<c10::ScalarType>(at::kFloat), std::optional<c10::ScalarType>(at::kBFloat16),
          std::optional<c10::ScalarType>()}) {
      SCOPED_TRACE(std::string("logits ") + c10::toString(logits_dtype) + ", grad " +
                   (grad_dtype ? c10::toString(*grad_dtype) : "none"));
      at::manual_seed(19);
      const XentInputs x = xent_inputs(logits_dtype, at::kCUDA);
      const XentClosedForm want = xent_closed_form(x, scale);
      const XentChunk got = softmax_xent(x.logits.clone(), x.targets, scale, grad_dtype, /*fused=*/true);
      EXPECT_TRUE(got.loss_sum.is_cuda());
      EXPECT_NEAR(got.loss_sum.item<double>(), want.loss, 1e-5 * want.loss);
      ASSERT_EQ(got.grad.defined(), grad_dtype.has_value());
      if (!grad_dtype) continue;
      EXPECT_EQ(got.grad.scalar_type(), *grad_dtype);
      const bool bf16 = *grad_dtype == at::kBFloat16;
      // absolute: a probability's float32 error (1e-6 of at most 1), seen where softmax - onehot cancels
      EXPECT_TRUE(at::allclose(got.grad.cpu().to(at::kDouble), want.grad, bf16 ? 1.0 / 256 : 1e-5, 1e-6 * scale));
    }
}
