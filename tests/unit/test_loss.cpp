// Chunked fused linear cross-entropy equals the unchunked computation (ATen's own
// cross_entropy over full fp32 logits), in value and in both gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include "model/loss.h"

using namespace ptrain;

namespace {
struct Result {
  at::Tensor loss, grad_h, grad_w;
};

Result reference(const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& t) {
  at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::Tensor loss = at::cross_entropy_loss(at::linear(h, w).to(at::kFloat), t, {}, at::Reduction::Mean, kIgnoreIndex);
  loss.backward();
  return {loss.detach(), h.grad(), w.grad()};
}

Result chunked(const at::Tensor& h0, const at::Tensor& w0, const at::Tensor& t, int64_t chunk) {
  at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_();
  at::Tensor loss = linear_cross_entropy(h, w, t, chunk);
  (loss * 3.0).backward();  // a non-unit upstream gradient must scale both grads
  return {loss.detach(), h.grad() / 3.0, w.grad() / 3.0};
}
}  // namespace

TEST(ChunkedLoss, EqualsUnchunkedForEveryChunkSize) {
  at::manual_seed(3);
  const int64_t N = 37, D = 16, V = 50;
  at::Tensor h = at::randn({N, D}), w = at::randn({V, D}) * 0.3;
  at::Tensor t = at::randint(0, V, {N}, at::kLong);
  t.index_put_({at::tensor(std::vector<int64_t>{0, 5, 6, 36})}, kIgnoreIndex);  // masked positions
  Result ref = reference(h, w, t);
  for (int64_t chunk : {1, 4, 7, 36, 37, 100, 0}) {
    Result got = chunked(h, w, t, chunk);
    EXPECT_NEAR(got.loss.item<double>(), ref.loss.item<double>(), 1e-5) << "chunk " << chunk;
    EXPECT_TRUE(at::allclose(got.grad_h, ref.grad_h, 1e-5, 1e-6)) << "chunk " << chunk;
    EXPECT_TRUE(at::allclose(got.grad_w, ref.grad_w, 1e-5, 1e-6)) << "chunk " << chunk;
  }
}

TEST(ChunkedLoss, MaskedRowsGetNoGradient) {
  at::manual_seed(4);
  at::Tensor h = at::randn({6, 8}), w = at::randn({11, 8});
  at::Tensor t = at::tensor(std::vector<int64_t>{1, kIgnoreIndex, 3, kIgnoreIndex, 5, 7});
  Result got = chunked(h, w, t, 2);
  EXPECT_EQ(got.grad_h[1].abs().sum().item<double>(), 0.0);
  EXPECT_EQ(got.grad_h[3].abs().sum().item<double>(), 0.0);
  EXPECT_GT(got.grad_h[0].abs().sum().item<double>(), 0.0);
}

TEST(ChunkedLoss, SumMatchesMeanTimesCount) {
  at::manual_seed(5);
  at::Tensor h = at::randn({20, 8}), w = at::randn({13, 8});
  at::Tensor t = at::randint(0, 13, {20}, at::kLong);
  t[3] = kIgnoreIndex;
  LossSum s = linear_cross_entropy_sum(h, w, t, 6);
  EXPECT_EQ(s.tokens, 19);
  EXPECT_NEAR(s.sum / 19.0, reference(h, w, t).loss.item<double>(), 1e-5);
}

TEST(ChunkedLoss, UniformLogitsGiveLogVocab) {
  // Zero weights -> uniform distribution -> loss = ln(V) exactly, whatever the targets.
  at::Tensor h = at::randn({9, 4}), w = at::zeros({32, 4});
  at::Tensor t = at::randint(0, 32, {9}, at::kLong);
  EXPECT_NEAR(linear_cross_entropy(h, w, t, 4).item<double>(), std::log(32.0), 1e-6);
}

// bf16 hidden/weight: float32 logits are the exact products accumulated in float32 — equal to
// the float64 reference of the same bf16 values to float32 accuracy; opting into bfloat16
// logits rounds each logit (relative 2^-9), so its loss drifts measurably but stays close.
TEST(ChunkedLoss, LogitsDtypeFloat32KeepsBf16InputsExact) {
  at::manual_seed(5);
  at::Tensor h = at::randn({64, 32}).to(at::kBFloat16), w = (at::randn({300, 32}) * 0.5).to(at::kBFloat16);
  at::Tensor t = at::randint(0, 300, {64}, at::kLong);
  const double ref =
      at::cross_entropy_loss(at::linear(h.to(at::kDouble), w.to(at::kDouble)), t, {}, at::Reduction::Mean, kIgnoreIndex)
          .item<double>();
  const double fp32 = linear_cross_entropy(h, w, t, 16, at::kFloat).item<double>();
  const double bf16 = linear_cross_entropy(h, w, t, 16, at::kBFloat16).item<double>();
  EXPECT_NEAR(fp32, ref, 1e-5 * std::abs(ref));
  EXPECT_GT(std::abs(bf16 - ref), 1e-5 * std::abs(ref));  // the rounding is visible ...
  EXPECT_NEAR(bf16, ref, 2e-2 * std::abs(ref));           // ... and bounded
}

// An adapter on the output projection: loss and the gradients for hidden, A and B equal
// float64 autograd through logits = h W^T + s (h A^T) B^T; W (frozen) gets none.
TEST(ChunkedLoss, OutputAdapterMatchesAutogradReference) {
  at::manual_seed(6);
  at::Tensor h0 = at::randn({20, 16}), w0 = at::randn({50, 16}) * 0.3, a0 = at::randn({4, 16}) * 0.2,
             b0 = at::randn({50, 4}) * 0.2;
  at::Tensor t = at::randint(0, 50, {20}, at::kLong);
  t[3] = kIgnoreIndex;
  const double s = 2.5;
  at::Tensor h = h0.clone().requires_grad_(), a = a0.clone().requires_grad_(), b = b0.clone().requires_grad_();
  OutputAdapter adapter{a, b, s};
  at::Tensor loss = linear_cross_entropy(h, w0, t, 7, at::kFloat, &adapter);
  (loss * 2.0).backward();
  at::Tensor hr = h0.to(at::kDouble).requires_grad_(), ar = a0.to(at::kDouble).requires_grad_(),
             br = b0.to(at::kDouble).requires_grad_();
  at::Tensor logits = at::linear(hr, w0.to(at::kDouble)) + at::linear(at::linear(hr, ar), br) * s;
  at::Tensor ref = at::cross_entropy_loss(logits, t, {}, at::Reduction::Mean, kIgnoreIndex);
  (ref * 2.0).backward();
  EXPECT_NEAR(loss.item<double>(), ref.item<double>(), 1e-5);
  EXPECT_TRUE(at::allclose(h.grad().to(at::kDouble), hr.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(at::allclose(a.grad().to(at::kDouble), ar.grad(), 1e-4, 1e-6));
  EXPECT_TRUE(at::allclose(b.grad().to(at::kDouble), br.grad(), 1e-4, 1e-6));
  LossSum sum = linear_cross_entropy_sum(h0, w0, t, 7, at::kFloat, &adapter);
  EXPECT_NEAR(sum.sum / sum.tokens, ref.item<double>(), 1e-5);
}
