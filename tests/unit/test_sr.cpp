// Stochastic rounding: unbiased where round-to-nearest is not, deterministic, independent of
// how a tensor is split, exact on representable values; the CUDA kernel equals the CPU
// reference bit for bit (on a GPU).
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>

#include "optim/stochastic_round.h"

using namespace ptrain;

TEST(StochasticRounding, UnbiasedWhereNearestIsNot) {
  // 1 + 2^-10 lies a quarter of the way... between bf16 neighbours 1 and 1 + 2^-7 (p = 1/8).
  const double x = 1.0 + std::ldexp(1.0, -10), spacing = std::ldexp(1.0, -7), p = 0.125;
  const int64_t n = 1 << 20;
  at::Tensor v = at::full({n}, x, at::kFloat);
  const double sr_mean = stochastic_round_bf16(v, 42, 0).to(at::kDouble).mean().item<double>();
  const double rne_mean = v.to(at::kBFloat16).to(at::kDouble).mean().item<double>();
  // Standard error of the mean of a two-point distribution: spacing * sqrt(p(1-p) / n).
  const double bound = 6.0 * spacing * std::sqrt(p * (1 - p) / static_cast<double>(n));
  EXPECT_LT(std::abs(sr_mean - x), bound) << "SR mean " << sr_mean;
  EXPECT_GT(std::abs(rne_mean - x), bound) << "round-to-nearest must fail this bound";
  // Only the two neighbours occur.
  at::Tensor r = stochastic_round_bf16(v.narrow(0, 0, 1000), 42, 0).to(at::kDouble);
  EXPECT_TRUE(at::logical_or(r.eq(1.0), r.eq(1.0 + spacing)).all().item<bool>());
}

TEST(StochasticRounding, DeterministicAndSplitInvariant) {
  at::manual_seed(0);
  at::Tensor v = at::randn({10001});
  at::Tensor a = stochastic_round_bf16(v, 7, 100), b = stochastic_round_bf16(v, 7, 100);
  EXPECT_TRUE(at::equal(a, b));
  EXPECT_FALSE(at::equal(a, stochastic_round_bf16(v, 8, 100)));  // another step's seed
  // Rounding a slice with its global offset gives the same bits as rounding the whole.
  at::Tensor tail = stochastic_round_bf16(v.narrow(0, 4000, 6001), 7, 100 + 4000);
  EXPECT_TRUE(at::equal(tail, a.narrow(0, 4000, 6001)));
}

TEST(StochasticRounding, RepresentableValuesAndSpecialsUnchanged) {
  at::Tensor v = at::tensor({0.0f, -0.0f, 1.0f, -2.5f, 3.0e38f, INFINITY, -INFINITY});
  at::Tensor r = stochastic_round_bf16(v, 1, 0);
  EXPECT_TRUE(at::equal(r.to(at::kFloat), v.to(at::kBFloat16).to(at::kFloat)));
  EXPECT_TRUE(std::isnan(stochastic_round_bf16(at::tensor({NAN}), 1, 0).item<float>()));
}

TEST(StochasticRounding, CudaKernelMatchesCpuReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  at::manual_seed(1);
  at::Tensor v = at::randn({1 << 20}) * 100;
  at::Tensor cpu = stochastic_round_bf16(v, 99, 12345);
  at::Tensor gpu = stochastic_round_bf16(v.cuda(), 99, 12345).cpu();
  EXPECT_TRUE(at::equal(cpu, gpu));
}
