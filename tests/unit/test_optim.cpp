// AdamW against torch.optim.AdamW's saved trajectory (fixture), clipping and the LR
// schedule against closed forms.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>

#include "checkpoint/safetensors.h"
#include "optim/adamw.h"
#include "optim/lr_schedule.h"
#include "parallel/grad_norm.h"
#include "test_util.h"

using namespace ptrain;

TEST(AdamW, MatchesTorchAdamWOverTenSteps) {
  SafetensorsFile f(test::fixture("adamw_expected.safetensors"));
  at::Tensor param = f.tensor("initial").clone().requires_grad_();
  at::Tensor grads = f.tensor("grads"), lrs = f.tensor("lrs"), expected = f.tensor("params");
  const int64_t decay = f.tensor("decay_numel").item<int64_t>();
  AdamW opt({{"p", param, decay}}, {0.9, 0.95, 1e-8, 0.1});
  for (int64_t step = 0; step < 10; ++step) {
    param.mutable_grad() = grads[step].clone();
    opt.step(lrs[step].item<double>());
    at::Tensor exp = expected[step];
    const double rel = ((param.detach() - exp).abs() / exp.abs().clamp_min(1e-12)).max().item<double>();
    EXPECT_LE(rel, 1e-6) << "step " << step + 1;
  }
  EXPECT_EQ(opt.steps(), 10);
}

TEST(AdamW, NoGradientMeansNoUpdate) {
  at::Tensor p = at::ones({5}).requires_grad_();
  AdamW opt({{"p", p, 5}}, {0.9, 0.95, 1e-8, 0.1});
  opt.step(1e-2);
  EXPECT_TRUE(at::equal(p.detach(), at::ones({5})));
}

TEST(Clip, GlobalNormAndScaling) {
  at::Tensor a = at::tensor({3.0f, 0.0f}), b = at::tensor({0.0f, 4.0f});
  EXPECT_NEAR(clip_grad_norm({a, b}, 0.0), 5.0, 1e-6);  // disabled: norm only
  EXPECT_NEAR(a[0].item<double>(), 3.0, 1e-7);
  EXPECT_NEAR(clip_grad_norm({a, b}, 1.0), 5.0, 1e-6);
  EXPECT_NEAR(at::cat({a, b}).norm().item<double>(), 1.0, 1e-5);  // scaled to max_norm
}

TEST(LrSchedule, WarmupCosineLinearConstant) {
  LrSchedule s{1.0, 110, {10, Decay::cosine, 0.1}};
  EXPECT_DOUBLE_EQ(s.lr(0), 0.1);
  EXPECT_DOUBLE_EQ(s.lr(9), 1.0);
  EXPECT_DOUBLE_EQ(s.lr(10), 1.0);
  EXPECT_NEAR(s.lr(109), 0.1, 1e-12);
  const double mid = 10 + 99 / 2.0;  // halfway through decay: (peak + min) / 2
  EXPECT_NEAR(s.lr(static_cast<int64_t>(mid)), 0.1 + 0.9 * 0.5 * (1 + std::cos(M_PI * (49.0 / 99.0))), 1e-12);
  LrSchedule lin{1.0, 11, {0, Decay::linear, 0.0}};
  EXPECT_NEAR(lin.lr(5), 0.5, 1e-12);
  LrSchedule c{2.0, 50, {0, Decay::constant, 0.0}};
  EXPECT_DOUBLE_EQ(c.lr(49), 2.0);
}

TEST(Clip, NormIsAccurateOnLargeShards) {
  // 3M float32 values: the norm must match a float64 reference to 1e-9, independently of how
  // the values are split into shards (the split must not change the clip factor).
  at::manual_seed(7);
  at::Tensor g = at::randn({3'000'000}) * 0.01 + 0.003;
  const double ref = g.to(at::kDouble).pow(2).sum().sqrt().item<double>();
  const double whole = clip_grad_norm({g.clone()}, 0.0);
  const double split =
      clip_grad_norm({g.narrow(0, 0, 1'234'567).clone(), g.narrow(0, 1'234'567, 1'765'433).clone()}, 0.0);
  EXPECT_NEAR(whole, ref, 1e-9 * ref);
  EXPECT_NEAR(split, ref, 1e-9 * ref);
}

// The fused CUDA bf16 AdamW + stochastic rounding kernel against the CPU reference (ATen ops).
// Both compute in float32 but not with the same roundings (ATen's CPU lerp fuses a multiply-add,
// nvcc fuses others), so a float32 value may differ in its last bit; stochastic rounding then
// draws the same random bits and lands on the same bf16 value unless the draw falls between the
// two. Each step therefore starts both optimizers from the same state (the CPU's, copied) and
// checks one update: every parameter within one bf16 step of the CPU's and at least 99% of them
// identical; every moment within one bf16 step, or — where the lerp's terms cancel and a last-bit
// difference of the operands is a large part of a tiny result — within 2^-16 of the moment's
// largest magnitude. A wrong decay range, seed, offset, beta or bias correction moves far more
// than that. (Over several unsynchronised steps one differing draw is carried on and, as a
// parameter passes zero, exceeds any relative bound — which is not a kernel error.)
TEST(AdamW, CudaFusedBf16StochasticMatchesCpuReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  at::manual_seed(2);
  at::Tensor pc = at::randn({10000}).to(at::kBFloat16), pg = pc.cuda();
  AdamWOptions o{0.9, 0.95, 1e-8, 0.1, true, 17};
  AdamW cpu({{"u", pc, 6000, 0}}, o), gpu({{"u", pg, 6000, 0}}, o);
  // |a - b| in bf16 steps: adjacent bf16 values of one sign differ by one in their bit pattern.
  const auto steps_apart = [](const at::Tensor& a, const at::Tensor& b) {
    const at::Tensor x = a.view(at::kShort).to(at::kInt), y = b.cpu().view(at::kShort).to(at::kInt);
    return (x - y).abs();
  };
  // Elements more than one bf16 step apart and, for moments, also farther than the floor.
  const auto outside = [&](const at::Tensor& a, const at::Tensor& b, double floor) {
    const at::Tensor far = steps_apart(a, b).gt(1);
    const at::Tensor x = a.to(at::kFloat), y = b.cpu().to(at::kFloat);
    return (far & (x - y).abs().gt(floor * x.abs().max().item<double>())).sum().item<int64_t>();
  };
  for (const OptimState& m : cpu.state()) ASSERT_EQ(m.tensor.scalar_type(), at::kBFloat16) << m.key;
  for (int s = 0; s < 10; ++s) {
    pg.copy_(pc);
    for (size_t k = 0; k < cpu.state().size(); ++k) gpu.state()[k].tensor.copy_(cpu.state()[k].tensor);
    at::Tensor g = at::randn({10000}).to(at::kBFloat16);
    cpu.begin_step();
    gpu.begin_step();
    cpu.update({{0, g}}, 1e-2);
    gpu.update({{0, g.cuda()}}, 1e-2);
    EXPECT_EQ(outside(pc, pg, 0.0), 0) << "step " << s;
    for (size_t k = 0; k < cpu.state().size(); ++k)
      EXPECT_EQ(outside(cpu.state()[k].tensor, gpu.state()[k].tensor, 1.0 / 65536), 0)
          << cpu.state()[k].key << ", step " << s;
    EXPECT_GE(pc.eq(pg.cpu()).to(at::kFloat).mean().item<double>(), 0.99) << "step " << s;
  }
}
