// How bf16 parameter updates are kept or lost, against closed forms: the lost-update counter on
// a case with a known count, Kahan summation and stochastic rounding over a long run of updates
// below half a bf16 ulp (where round-to-nearest keeps none), and compare's seed statistics.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cmath>

#include "app/compare.h"
#include "optim/adamw.h"

using namespace ptrain;

namespace {

enum class Rounding { nearest, stochastic, kahan };

std::unique_ptr<AdamW> adamw(const at::Tensor& p, Rounding r, double weight_decay = 0.0) {
  return std::make_unique<AdamW>(
      std::vector<OptimTarget>{{"p", p, p.numel(), 0}},
      AdamWOptions{0.9, 0.95, 1e-8, weight_decay, r == Rounding::stochastic, 7, r == Rounding::kahan});
}

// The bf16 values around x: bf16 keeps 8 significant bits, so in x's binade they are
// ulp = 2^(exponent - 7) apart.
std::pair<double, double> bf16_neighbours(double x) {
  const double ulp = std::ldexp(1.0, std::ilogb(x) - 7), below = std::floor(x / ulp) * ulp;
  return {below, below + ulp};
}

}  // namespace

// 400 elements with a gradient: 200 at 1.0, where an update of lr = 1e-3 is under half an ulp
// (2^-9 below 1.0), and 200 at 0.01, where it is 16 ulps; 112 without a gradient (no update
// computed). AdamW's first step moves each element by lr (m̂ / √v̂ = sign g).
TEST(UpdateRounding, LostUpdatesAreCountedExactly) {
  auto make = [](at::ScalarType dtype) {
    at::Tensor p = at::cat({at::full({200}, 1.0), at::full({200}, 0.01), at::full({112}, 0.5)}).to(dtype);
    p.requires_grad_();
    p.mutable_grad() = at::cat({at::ones({400}), at::zeros({112})}).to(dtype);
    return p;
  };
  const double lr = 1e-3;
  for (const auto& [dtype, rounding, lost] :
       std::vector<std::tuple<at::ScalarType, Rounding, int64_t>>{{at::kFloat, Rounding::nearest, 0},
                                                                  {at::kBFloat16, Rounding::nearest, 200},
                                                                  {at::kBFloat16, Rounding::kahan, 0}}) {
    SCOPED_TRACE(std::string(c10::toString(dtype)) + (rounding == Rounding::kahan ? " kahan" : ""));
    at::Tensor p = make(dtype);
    auto opt = adamw(p, rounding);
    opt->count_lost_updates(true);
    opt->step(lr);
    const UpdateCounts c = opt->take_update_counts();
    EXPECT_EQ(c.computed, 400);
    EXPECT_EQ(c.lost, lost);
    EXPECT_EQ(opt->take_update_counts().computed, 0);  // taken: counting starts again
  }
  // Stochastic rounding keeps 1.0 - 1e-3 at 1.0 with probability (x - below) / ulp: binomial.
  at::Tensor p = make(at::kBFloat16);
  auto opt = adamw(p, Rounding::stochastic);
  opt->count_lost_updates(true);
  opt->step(lr);
  const UpdateCounts c = opt->take_update_counts();
  const auto [below, above] = bf16_neighbours(1.0 - lr);
  const double keep = (1.0 - lr - below) / (above - below), mean = 200 * keep, sd = std::sqrt(200 * keep * (1 - keep));
  EXPECT_EQ(c.computed, 400);
  EXPECT_NEAR(static_cast<double>(c.lost), mean, 4 * sd) << "P(kept) = " << keep;
  // Weight decay is an update too: the gradient-free elements at 0.5 are decayed by lr·wd·0.5 =
  // 5e-5, under half an ulp (2^-9) of 0.5.
  at::Tensor q = make(at::kBFloat16);
  auto decayed = adamw(q, Rounding::nearest, 0.1);
  decayed->count_lost_updates(true);
  decayed->step(lr);
  const UpdateCounts d = decayed->take_update_counts();
  EXPECT_EQ(d.computed, 512);
  EXPECT_EQ(d.lost, 200 + 112);
}

// 1,000 AdamW steps with a constant gradient move every element by lr = 2e-4 each (0.2 in all),
// each step under half a bf16 ulp of 1.0: round-to-nearest keeps none of them; with Kahan
// summation every element stays within one bf16 ulp of the float32 run; stochastic rounding's
// mean over 4,096 elements equals it within four standard errors (each step's rounding error has
// variance at most ulp²/4).
TEST(UpdateRounding, KahanAndStochasticRoundingKeepUpdatesBelowHalfAnUlp) {
  const int64_t n = 4096, steps = 1000;
  const double lr = 2e-4;
  auto run = [&](at::ScalarType dtype, Rounding r) {
    at::Tensor p = at::ones({n}, dtype).requires_grad_();
    auto opt = adamw(p, r);
    for (int64_t t = 0; t < steps; ++t) {
      p.mutable_grad() = at::full({n}, -1.0, dtype);
      opt->step(lr);
    }
    return p.detach().to(at::kDouble);
  };
  const double exact = run(at::kFloat, Rounding::nearest).mean().item<double>();
  EXPECT_NEAR(exact, 1.0 + steps * lr, 1e-3);
  const double ulp = std::ldexp(1.0, -7);  // bf16 at [1, 2)

  EXPECT_TRUE(at::equal(run(at::kBFloat16, Rounding::nearest), at::ones({n}, at::kDouble)));

  const at::Tensor kahan = run(at::kBFloat16, Rounding::kahan);
  EXPECT_LE((kahan - exact).abs().max().item<double>(), ulp);

  const at::Tensor sr = run(at::kBFloat16, Rounding::stochastic);
  const double standard_error = std::sqrt(steps * ulp * ulp / 4 / n);
  EXPECT_NEAR(sr.mean().item<double>(), exact, 4 * standard_error);
  EXPECT_GT(sr.std().item<double>(), 0.0);  // the elements did round differently
}

TEST(UpdateRounding, SeedStatisticsAndSpread) {
  const SeedStats a = seed_stats({1.0, 2.0, 3.0});
  EXPECT_EQ(a.n, 3);
  EXPECT_DOUBLE_EQ(a.mean, 2.0);
  EXPECT_DOUBLE_EQ(a.std, 1.0);  // sample standard deviation: sqrt(2 / 2)
  EXPECT_EQ(a.min, 1.0);
  EXPECT_EQ(a.max, 3.0);
  EXPECT_FALSE(beyond_seed_spread(a, seed_stats({2.5, 3.5})));  // ranges overlap
  EXPECT_TRUE(beyond_seed_spread(a, seed_stats({3.01, 3.5})));  // above the whole range
  EXPECT_TRUE(beyond_seed_spread(seed_stats({0.1, 0.9}), a));   // below it
  EXPECT_FALSE(beyond_seed_spread(seed_stats({9.0}), a));       // one seed has no spread
  EXPECT_EQ(seed_stats({5.0}).std, 0.0);
}
