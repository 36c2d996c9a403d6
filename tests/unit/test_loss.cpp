// Chunked fused linear cross-entropy equals the unchunked computation (ATen's own
// cross_entropy over full fp32 logits), in value and in both gradients.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "common/alloc_meter.h"
#include "model/loss.h"
#include "train/memory.h"

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

// Evaluation's token statistics (training.token_metrics: val_entropy, val_mean_token_accuracy):
// over the unmasked rows only, the entropy of softmax(h W^T) and the rows whose target is the
// argmax — targets set to the argmax on every third row, so the count is known.
TEST(ChunkedLoss, SumsTheUnmaskedTokensEntropyAndTopOneHits) {
  at::manual_seed(6);
  const int64_t N = 20, V = 13;
  at::Tensor h = at::randn({N, 8}), w = at::randn({V, 8});
  const at::Tensor logp = at::log_softmax(at::linear(h, w).to(at::kDouble), -1);
  at::Tensor t = (logp.argmax(-1) + 1).remainder(V);           // never the argmax...
  for (int64_t i = 0; i < N; i += 3) t[i] = logp[i].argmax();  // ...but on rows 0, 3, ..., 18
  t[3] = kIgnoreIndex;                                         // one hit masked
  t[4] = kIgnoreIndex;                                         // one miss masked
  const at::Tensor kept = t.ne(kIgnoreIndex);
  for (bool fused : {false, true}) {
    const LossSum s = linear_cross_entropy_sum(h, w, t, 6, at::kFloat, nullptr, fused, /*token_stats=*/true);
    EXPECT_EQ(s.tokens, 18);
    EXPECT_EQ(s.top1, 6.0) << "fused " << fused;  // 7 argmax rows, one masked
    EXPECT_NEAR(s.entropy_sum, -(logp.exp() * logp).sum(-1).index({kept}).sum().item<double>(), 1e-4);
    const LossSum plain = linear_cross_entropy_sum(h, w, t, 6, at::kFloat, nullptr, fused);
    EXPECT_EQ(plain.sum, s.sum);  // the statistics leave the loss as it is
    EXPECT_EQ(plain.entropy_sum, 0.0);
  }
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

// On CUDA the matmuls take other paths than on the CPU (cuBLAS multiplies bf16 operands into
// float32 directly; the CPU widens them first): the loss and every gradient the chunked loss
// forms itself — hidden and output weight, or hidden and the output adapter's A and B over a
// frozen weight — equal the CPU's in float32 and bf16 (float32 or bf16 logits), within the
// rounding of the dtype. Odd sizes: 37 tokens in chunks of 16, vocabulary 101.
TEST(ChunkedLoss, CudaMatchesCpuInEveryDtypeWithAndWithoutTheOutputAdapter) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the loss's CUDA matmuls run on the GPU machine";
  at::manual_seed(11);
  const int64_t N = 37, D = 24, V = 101, R = 4;
  const at::Tensor h0 = at::randn({N, D}), w0 = at::randn({V, D}) * 0.3, a0 = at::randn({R, D}) * 0.2,
                   b0 = at::randn({V, R}) * 0.2;
  at::Tensor t = at::randint(0, V, {N}, at::kLong);
  t[5] = kIgnoreIndex;
  const std::vector<std::pair<at::ScalarType, at::ScalarType>> modes{
      {at::kFloat, at::kFloat}, {at::kBFloat16, at::kFloat}, {at::kBFloat16, at::kBFloat16}};
  for (const auto& [dtype, logits] : modes)
    for (const bool lora : {false, true}) {
      const auto run = [&](const c10::Device& device) {
        // Fresh leaves on every run: x.to() returns x itself for the CPU in float32, and a leaf
        // shared between runs would carry its gradient (and requires_grad) into the next one.
        const auto copy = [&](const at::Tensor& x) { return x.to(device, dtype, false, /*copy=*/true); };
        const auto on = [&](const at::Tensor& x) { return copy(x).requires_grad_(); };
        at::Tensor h = on(h0), w = lora ? copy(w0) : on(w0), a = on(a0), b = on(b0);
        const OutputAdapter adapter{a, b, 2.0};
        at::Tensor loss = linear_cross_entropy(h, w, t.to(device), 16, logits, lora ? &adapter : nullptr);
        loss.backward();
        std::vector<at::Tensor> out{loss.detach(), h.grad()};
        if (lora) {
          out.push_back(a.grad());
          out.push_back(b.grad());
        } else {
          out.push_back(w.grad());
        }
        for (auto& x : out) x = x.cpu().to(at::kDouble);
        return out;
      };
      const std::vector<at::Tensor> cpu = run(c10::Device(c10::kCPU)), gpu = run(c10::Device(c10::kCUDA, 0));
      const std::vector<std::string> names = lora ? std::vector<std::string>{"loss", "hidden", "A", "B"}
                                                  : std::vector<std::string>{"loss", "hidden", "weight"};
      const double tolerance = dtype == at::kFloat ? 1e-4 : 1e-2;  // relative to the tensor's largest
      for (size_t i = 0; i < cpu.size(); ++i) {
        const double scale = cpu[i].abs().max().item<double>();
        EXPECT_LE((gpu[i] - cpu[i]).abs().max().item<double>(), tolerance * scale)
            << names[i] << ", " << dtype << " with " << logits << " logits" << (lora ? ", output adapter" : "");
      }
    }
}

// The memory planner's bytes per logit (loss_chunk_bytes_per_logit) against what the loss's
// forward allocates on the CPU's composite path (AllocationMeter), float32 throughout (bf16 on
// the CPU goes through float32 copies a GPU does not make): one chunk of a wide vocabulary, so
// the [tokens, vocab] tensors dominate, plus what the forward keeps — the gradients w.r.t. the
// hidden states, the output weight and an adapter's A and B, z = h A^T — and a few per-token
// vectors (targets' mask, log-sum-exp, picked logits).
TEST(ChunkedLoss, ForwardAllocatesThePlannedBytesPerLogit) {
  const int64_t N = 256, d = 8, V = 8192, r = 4;
  for (const bool with_adapter : {false, true}) {
    SCOPED_TRACE(with_adapter ? "adapter" : "no adapter");
    at::manual_seed(3);
    const at::Tensor h = at::randn({N, d}).requires_grad_(), w = at::randn({V, d}).requires_grad_();
    const at::Tensor a = at::randn({r, d}).mul_(0.1).requires_grad_(), b = at::randn({V, r}).mul_(0.1).requires_grad_();
    const at::Tensor t = at::randint(V, {N}, at::kLong);
    const OutputAdapter adapter{a, b, 2.0};
    int64_t peak = 0;
    {
      MeterScope scope;
      const at::Tensor loss = linear_cross_entropy(h, w, t, N, at::kFloat, with_adapter ? &adapter : nullptr);
      peak = scope.meter().peak.load();
    }
    const int64_t kept = 4 * (N * d + V * d) + (with_adapter ? 4 * (r * d + V * r + N * r) : 0);
    const int64_t predicted = kept + N * V * loss_chunk_bytes_per_logit(4, 4, 4, with_adapter, /*fused=*/false);
    EXPECT_LE(peak, predicted + N * 64) << "the plan under-counts";
    EXPECT_GE(peak, predicted) << "the plan over-counts: " << peak << " of " << predicted << " bytes";
  }
}

// The same on a GPU with the fused loss kernel (kernels.fused_loss), in bf16 compute with
// float32 logits as mixed and bf16 training run it: the allocator's peak during the forward
// against the planner's bytes per logit. (Where an output adapter's product was added through a
// [tokens, vocab] temporary, chat QLoRA peaked 12 % above its plan on an H200.)
TEST(ChunkedLoss, CudaFusedForwardAllocatesThePlannedBytesPerLogit) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the fused loss kernel's allocations are measured on the GPU machine";
  const int64_t N = 1024, d = 64, V = 32768, r = 16;
  const auto on = at::TensorOptions().device(at::kCUDA).dtype(at::kBFloat16);
  for (const bool with_adapter : {false, true}) {
    SCOPED_TRACE(with_adapter ? "adapter" : "no adapter");
    at::manual_seed(5);
    const at::Tensor h = at::randn({N, d}, on).requires_grad_(), w = at::randn({V, d}, on).requires_grad_();
    const at::Tensor a = at::randn({r, d}, on).mul_(0.1).requires_grad_();
    const at::Tensor b = at::randn({V, r}, on).mul_(0.1).requires_grad_();
    const at::Tensor t = at::randint(V, {N}, at::TensorOptions().device(at::kCUDA).dtype(at::kLong));
    const OutputAdapter adapter{a, b, 2.0};
    auto run = [&] { return linear_cross_entropy(h, w, t, N, at::kFloat, with_adapter ? &adapter : nullptr, true); };
    run();  // the thread's cuBLAS workspace, allocated once, outside the measurement
    int64_t used = 0;
    {
      const PhasePeak phase(h.device());
      const at::Tensor loss = run();
      used = phase.peak() - phase.start();
    }
    // Beside the chunk: the gradients w.r.t. the hidden states (bf16) and the weight (float32;
    // its bf16 copy comes after the chunk); with the adapter float32 copies of A and B, their
    // gradients, z and dz.
    const int64_t kept = N * d * 2 + V * d * 4 + (with_adapter ? 2 * 4 * (r * d + V * r) + 2 * 4 * N * r : 0);
    const int64_t per_logit = loss_chunk_bytes_per_logit(4, with_adapter ? 4 : 2, 2, with_adapter, /*fused=*/true);
    const int64_t predicted = kept + N * V * per_logit;
    EXPECT_LE(used, predicted + N * 64) << "the plan under-counts";
    EXPECT_GE(used, predicted * 0.95) << "the plan over-counts: " << used << " of " << predicted << " bytes";
  }
}

// The per-token statistics of linear_token_logprobs (TRL's fused head outputs: DPO's metrics,
// WPO's weights) against their definitions in float64 over the whole logits: entropy, log sum
// p^2, the mean logit and whether the target is the first largest logit (TRL's is_top1: the
// target's logit at least the maximum and above every logit before it) — with exact ties, at
// every chunk size, over a row count that is no multiple of the 16 rows they are taken at.
TEST(ChunkedLoss, TokenStatsAreTheDistributionsEntropySquaresMeanAndTopOne) {
  at::manual_seed(4);
  const int64_t N = 37, D = 10, V = 61;
  const at::Tensor h = at::randn({N, D}), w = at::randn({V, D});
  w[40].copy_(w[9]);  // logits 9 and 40 equal in every row
  w[9].mul_(6.0);
  w[40].copy_(w[9]);  // ... and often the largest
  const at::Tensor z = at::linear(h.to(at::kDouble), w.to(at::kDouble));
  at::Tensor t = at::randint(V, {N}, at::kLong);
  int64_t planted = 0;
  for (int64_t i = 0; i < N; ++i) {  // where 9 and 40 are the largest: the target one of them, or the runner-up
    if (z[i].argmax().item<int64_t>() != 9) continue;
    const int64_t runner_up = std::get<1>(z[i].topk(3))[2].item<int64_t>();
    t[i] = planted % 3 == 0 ? 9 : planted % 3 == 1 ? 40 : runner_up;
    ++planted;
  }
  t[5] = kIgnoreIndex;
  const at::Tensor logp = at::log_softmax(z, 1), p = logp.exp();
  const at::Tensor want_entropy = -(p * logp).sum(1), want_sq = (p * p).sum(1).log(), want_mean = z.mean(1);
  std::vector<double> want_top1;
  int64_t ties = 0;
  for (int64_t i = 0; i < N; ++i) {
    const int64_t target = t[i].item<int64_t>();
    if (target < 0) {
      want_top1.push_back(0.0);
      continue;
    }
    const double zt = z[i][target].item<double>(),
                 before = target == 0 ? -1e300 : z[i].narrow(0, 0, target).max().item<double>();
    want_top1.push_back(zt >= z[i].max().item<double>() && zt > before ? 1.0 : 0.0);
    ties += target == 40 && want_top1.back() == 0.0;
  }
  ASSERT_GE(ties, 2) << "the fixture plants no tie the first-largest rule decides";
  for (const int64_t chunk : {int64_t{1}, int64_t{7}, N}) {
    SCOPED_TRACE("chunk " + std::to_string(chunk));
    at::Tensor stats;
    const at::Tensor logps = linear_token_logprobs(h, w, t, chunk, at::kFloat, nullptr, false, &stats);
    ASSERT_EQ(stats.sizes(), (std::vector<int64_t>{N, TokenStat::count}));
    EXPECT_FALSE(stats.requires_grad());
    const at::Tensor s = stats.to(at::kDouble);
    // the entropy within the rounding of the log-sum-exp it is taken against (float32 of the
    // largest logits), the others within float32's
    const double lse_rounding = 4 * std::ldexp(1.0, -24) * z.abs().max().item<double>();
    EXPECT_TRUE(at::allclose(s.select(1, TokenStat::entropy), want_entropy, 1e-5, lse_rounding));
    EXPECT_TRUE(at::allclose(s.select(1, TokenStat::log_sum_sq), want_sq, 1e-5, 1e-6));
    EXPECT_TRUE(at::allclose(s.select(1, TokenStat::mean_logit), want_mean, 1e-5, 1e-6));
    const at::Tensor top1 = s.select(1, TokenStat::is_top1);
    for (int64_t i = 0; i < N; ++i) EXPECT_EQ(top1[i].item<double>(), want_top1[i]) << "row " << i;
  }
}

// A real vocabulary's tail: a language model puts nearly all its mass on a few tokens and
// ~1e-9 on each of tens of thousands of others, whose terms of the entropy's sum each lie below
// half an ulp of the sum: a float32 running sum (a BLAS dot) loses all of them — measured 1.5e-4
// of SmolLM2's entropy, low —; the statistics keep them, = float64's. The logits are exactly the
// first column of the weight (h = [s, 0]), s scaling them per row.
TEST(ChunkedLoss, TokenStatsKeepAWideVocabularysTail) {
  at::manual_seed(8);
  const int64_t V = int64_t{1} << 16;
  at::Tensor w = at::zeros({V, 2});
  w.select(1, 0).copy_(at::randn({V}) * 0.5 - 20.0);           // the tail
  w.select(1, 0).narrow(0, 0, 8).copy_(at::randn({8}) * 1.5);  // the few likely tokens
  const at::Tensor h = at::tensor({1.0f, 0.0f, 0.8f, 0.0f, 1.2f, 0.0f}).view({3, 2});
  const at::Tensor t = at::tensor({int64_t{0}, int64_t{3}, V - 1});
  at::Tensor stats;
  linear_token_logprobs(h, w, t, 3, at::kFloat, nullptr, false, &stats);
  const at::Tensor z = at::linear(h.to(at::kDouble), w.to(at::kDouble));
  const at::Tensor logp = at::log_softmax(z, 1);
  const at::Tensor want = -(logp.exp() * logp).sum(1);
  const at::Tensor got = stats.select(1, TokenStat::entropy).to(at::kDouble);
  const double lse_rounding = 4 * std::ldexp(1.0, -24) * z.abs().max().item<double>();
  EXPECT_TRUE(at::allclose(got, want, 1e-6, lse_rounding))
      << "largest difference " << (got - want).abs().max().item<double>() << " of " << want;
}

// The bytes the statistics take beside a chunk's logits, as the memory plan counts them
// (token_stats_bytes; train/memory.cpp): the forward's allocator peak with them is at most the
// chunk's without them, or the logits and token_stats_bytes where that is more.
TEST(ChunkedLoss, TokenStatsAllocateAtMostThePlannedBytes) {
  const int64_t D = 8, V = 4096;
  for (const int64_t N : {int64_t{16}, int64_t{40}}) {
    SCOPED_TRACE("tokens " + std::to_string(N));
    at::manual_seed(6);
    const at::Tensor h = at::randn({N, D}), w = at::randn({V, D}), t = at::randint(V, {N}, at::kLong);
    int64_t peak = 0;
    {
      MeterScope scope;
      at::Tensor stats;
      const at::Tensor logps = linear_token_logprobs(h, w, t, N, at::kFloat, nullptr, false, &stats);
      peak = scope.meter().peak.load();
    }
    const int64_t chunk = N * V * 4;
    const int64_t planned =
        std::max(N * V * loss_chunk_bytes_per_logit(4, 4, 4, false, false), chunk + token_stats_bytes(V, 4)) +
        N * TokenStat::count * 4;
    EXPECT_LE(peak, planned + N * 64) << "the plan under-counts";
    EXPECT_GE(peak, planned - N * TokenStat::count * 4 - N * 64)
        << "the plan over-counts: " << peak << " of " << planned;
  }
}

// Per-token log-probabilities (what DPO and SimPO sum per sequence) against ATen's log_softmax
// and autograd: the values at every chunk size, masked positions 0, and the gradients w.r.t.
// the hidden states, the weight and an output adapter's A and B under a random incoming
// gradient per token (backward recomputes the chunks).
TEST(ChunkedLoss, TokenLogprobsMatchLogSoftmaxInValueAndGradient) {
  at::manual_seed(21);
  const int64_t N = 29, D = 12, V = 53, R = 3;
  const at::Tensor h0 = at::randn({N, D}), w0 = at::randn({V, D}) * 0.4, a0 = at::randn({R, D}) * 0.3,
                   b0 = at::randn({V, R}) * 0.3, up = at::randn({N});
  at::Tensor t = at::randint(V, {N}, at::kLong);
  t.index_put_({at::arange(0, N, 4)}, kIgnoreIndex);
  const at::Tensor valid = t.ne(kIgnoreIndex);
  for (const bool with_adapter : {false, true}) {
    at::Tensor h = h0.clone().requires_grad_(), w = w0.clone().requires_grad_(), a = a0.clone().requires_grad_(),
               b = b0.clone().requires_grad_();
    at::Tensor logits = at::linear(h, w);
    if (with_adapter) logits = logits + 1.5 * at::linear(at::linear(h, a), b);
    const at::Tensor want = at::log_softmax(logits, 1).gather(1, t.clamp_min(0).unsqueeze(1)).squeeze(1) * valid;
    (want * up).sum().backward();
    for (const int64_t chunk : {int64_t{1}, int64_t{5}, N}) {
      SCOPED_TRACE(std::string(with_adapter ? "adapter" : "no adapter") + ", chunk " + std::to_string(chunk));
      at::Tensor h2 = h0.clone().requires_grad_(), w2 = w0.clone().requires_grad_(), a2 = a0.clone().requires_grad_(),
                 b2 = b0.clone().requires_grad_();
      const OutputAdapter adapter{a2, b2, 1.5};
      const at::Tensor got =
          linear_token_logprobs(h2, w2, t, chunk, at::kFloat, with_adapter ? &adapter : nullptr, /*fused=*/true);
      EXPECT_TRUE(at::allclose(got, want.detach(), 1e-5, 1e-6));
      EXPECT_TRUE(at::equal(got.masked_select(valid.logical_not()), at::zeros({N / 4 + 1}))) << "masked rows";
      (got * up).sum().backward();
      EXPECT_TRUE(at::allclose(h2.grad(), h.grad(), 1e-5, 1e-6));
      EXPECT_TRUE(at::allclose(w2.grad(), w.grad(), 1e-5, 1e-6));
      if (with_adapter) {
        EXPECT_TRUE(at::allclose(a2.grad(), a.grad(), 1e-5, 1e-6));
        EXPECT_TRUE(at::allclose(b2.grad(), b.grad(), 1e-5, 1e-6));
      }
    }
  }
}
