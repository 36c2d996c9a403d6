// AdamW8bit and its blockwise 8-bit quantization against bitsandbytes 0.50.2 (outputs saved by
// tests/fixtures/make_bnb_fixtures.py), against float32 AdamW, and against itself across
// shardings.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cmath>

#include "checkpoint/safetensors.h"
#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "quant/blockwise8.h"
#include "test_util.h"

using namespace ptrain;

namespace {
SafetensorsFile& bnb() {
  static SafetensorsFile f(test::fixture("bitsandbytes.safetensors"));
  return f;
}

// One unit holding a 5000-element tensor (8-bit state) and a 300-element one (float32 state),
// both decayed, each group padded to 256: the fixture's two bitsandbytes parameters.
UnitLayout two_tensor_unit() {
  UnitLayout u;
  u.name = "u";
  ParamSlot big{"big", {5000}, 0, 5000, true, 0.0}, small{"small", {300}, 5120, 300, true, 0.0};
  u.slots = {big, small};
  u.group_begins = {0, 5120};
  u.numel = u.decay_numel = 5632;
  return u;
}

at::Tensor to_unit(const at::Tensor& packed) {  // [5300] -> [5632] with zero padding
  at::Tensor out = at::zeros({5632});
  out.narrow(0, 0, 5000).copy_(packed.narrow(0, 0, 5000));
  out.narrow(0, 5120, 300).copy_(packed.narrow(0, 5000, 300));
  return out;
}
at::Tensor from_unit(const at::Tensor& flat) { return at::cat({flat.narrow(0, 0, 5000), flat.narrow(0, 5120, 300)}); }
}  // namespace

TEST(Blockwise8, DynamicMapsBitIdenticalToBitsandbytes) {
  EXPECT_TRUE(at::equal(q8::dynamic_map(true), bnb().tensor("code_signed")));
  EXPECT_TRUE(at::equal(q8::dynamic_map(false), bnb().tensor("code_unsigned")));
}

TEST(Blockwise8, QuantizeDequantizeBitIdenticalToBitsandbytes) {
  for (const std::string name : {"signed", "unsigned"}) {
    at::Tensor code = q8::dynamic_map(name == "signed");
    at::Tensor x = bnb().tensor("x_" + name);
    auto [q, absmax] = q8::quantize_blockwise(x, code, 256);
    EXPECT_TRUE(at::equal(q, bnb().tensor("q_" + name)))
        << name << ": " << q.ne(bnb().tensor("q_" + name)).sum().item<int64_t>() << " codes differ";
    EXPECT_TRUE(at::equal(absmax, bnb().tensor("absmax_" + name))) << name;
    EXPECT_TRUE(at::equal(q8::dequantize_blockwise(q, absmax, code, 256), bnb().tensor("dq_" + name))) << name;
  }
}

// bitsandbytes' native CPU library searches approximately: where it disagrees with the
// reference semantics, ptrain's code is the nearer one (never farther).
TEST(Blockwise8, NeverFartherThanBitsandbytesNativeCpu) {
  for (const std::string name : {"signed", "unsigned"}) {
    at::Tensor code = q8::dynamic_map(name == "signed");
    at::Tensor x = bnb().tensor("x_" + name);
    auto [q, absmax] = q8::quantize_blockwise(x, code, 256);
    at::Tensor native = bnb().tensor("qnative_" + name);
    at::Tensor scale = absmax.clamp_min(1e-38).repeat_interleave(256).narrow(0, 0, x.numel());
    at::Tensor scaled = (x.to(at::kDouble) / scale.to(at::kDouble)).clamp(-1, 1);
    at::Tensor ours = (scaled - code.index_select(0, q.to(at::kLong)).to(at::kDouble)).abs();
    at::Tensor theirs = (scaled - code.index_select(0, native.to(at::kLong)).to(at::kDouble)).abs();
    EXPECT_TRUE(at::all(ours <= theirs + 1e-7).item<bool>()) << name;
    EXPECT_GT(q.ne(native).sum().item<int64_t>(), 0) << "the fixture should exercise the difference";
  }
}

// bitsandbytes.optim.AdamW8bit on CPU, 10 steps, one tensor with 8-bit state and one small
// enough for float32 state. `adam_p_after_ref` is bitsandbytes' update requantizing with the
// reference (CUDA-semantics) quantizer ptrain implements: it must agree to float32 rounding of
// the update math. `adam_p_after` is the stock CPU optimizer, whose native library picks a
// farther code for a few moments close to a midpoint: it agrees closely on average, and within
// a few percent of the distance travelled on the worst element.
TEST(AdamW8bit, MatchesBitsandbytesAdamW8bit) {
  for (const std::string key : {"adam_p_after_ref", "adam_p_after"}) {
    UnitLayout u = two_tensor_unit();
    at::Tensor p = to_unit(bnb().tensor("adam_p0"));
    AdamW8bit opt({{"u", p, u.decay_numel, 0}}, {Blocking::of(u, 0, u.numel, 4096)},
                  {{0.9, 0.95, 1e-8, 0.1, false, 0}, 4096});
    at::Tensor grads = bnb().tensor("adam_grads"), expected = bnb().tensor(key);
    at::Tensor p0 = from_unit(p).clone();
    for (int64_t s = 0; s < grads.size(0); ++s) {
      opt.begin_step();
      opt.update({{0, to_unit(grads[s])}}, 1e-2);
      at::Tensor got = from_unit(p), want = expected[s];
      const double moved = (want - p0).abs().max().item<double>();
      EXPECT_LE((got.narrow(0, 5000, 300) - want.narrow(0, 5000, 300)).abs().max().item<double>(), 1e-6)
          << key << " step " << s;
      at::Tensor d = (got.narrow(0, 0, 5000) - want.narrow(0, 0, 5000)).abs();
      if (key == "adam_p_after_ref") {
        EXPECT_LE(d.max().item<double>(), 1e-6) << key << " step " << s;
      } else {
        EXPECT_LE(d.max().item<double>(), 5e-2 * moved) << key << " step " << s;
        EXPECT_LE(d.mean().item<double>(), 1e-4 * moved) << key << " step " << s;
      }
    }
    EXPECT_TRUE(at::equal(p.narrow(0, 5000, 120), at::zeros({120})));  // padding stays zero
  }
}

// 100 steps on a noisy quadratic: the 8-bit trajectory stays within 2% of the distance float32
// AdamW travels, and reaches the same loss within 2%.
TEST(AdamW8bit, TracksFloat32AdamWOver100Steps) {
  UnitLayout u;
  u.name = "u";
  u.slots = {{"w", {8192}, 0, 8192, true, 0.0}};
  u.group_begins = {0};
  u.numel = u.decay_numel = 8192;
  at::manual_seed(4);
  at::Tensor target = at::randn({8192}), p0 = at::randn({8192}) * 0.1;
  at::Tensor p8 = p0.clone(), p32 = p0.clone();
  AdamW8bit opt8({{"u", p8, 8192, 0}}, {Blocking::of(u, 0, 8192, 4096)}, {{0.9, 0.95, 1e-8, 0.01, false, 0}, 4096});
  AdamW opt32({{"u", p32, 8192, 0}}, {0.9, 0.95, 1e-8, 0.01, false, 0});
  at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(7);
  for (int s = 0; s < 100; ++s) {
    at::Tensor noise = at::randn({8192}, gen) * 0.3;
    opt8.begin_step();
    opt8.update({{0, p8 - target + noise}}, 1e-2);
    opt32.begin_step();
    opt32.update({{0, p32 - target + noise}}, 1e-2);
  }
  const double travelled = (p32 - p0).norm().item<double>();
  EXPECT_LE((p8 - p32).norm().item<double>(), 0.02 * travelled);
  const double l8 = (p8 - target).square().sum().item<double>(), l32 = (p32 - target).square().sum().item<double>();
  EXPECT_NEAR(l8, l32, 0.02 * l32);
}

// Two "ranks" each stepping their half of a unit hold exactly the state and parameters of one
// optimizer stepping the whole unit: blocks never straddle shards.
TEST(AdamW8bit, ShardedEqualsUnsharded) {
  UnitLayout u = two_tensor_unit();
  at::manual_seed(9);
  at::Tensor p_full = to_unit(at::randn({5300})), p_a = p_full.narrow(0, 0, 2816).clone(),
             p_b = p_full.narrow(0, 2816, 2816).clone();
  AdamW8bitOptions o{{0.9, 0.95, 1e-8, 0.1, false, 0}, 4096};
  AdamW8bit whole({{"u", p_full, 5632, 0}}, {Blocking::of(u, 0, 5632, 4096)}, o);
  AdamW8bit half_a({{"u", p_a, 2816, 0}}, {Blocking::of(u, 0, 2816, 4096)}, o);
  AdamW8bit half_b({{"u", p_b, 5632 - 2816, 2816}}, {Blocking::of(u, 2816, 2816, 4096)}, o);
  for (int s = 0; s < 5; ++s) {
    at::Tensor g = to_unit(at::randn({5300}));
    for (AdamW8bit* opt : {&whole, &half_a, &half_b}) opt->begin_step();
    whole.update({{0, g}}, 1e-2);
    half_a.update({{0, g.narrow(0, 0, 2816)}}, 1e-2);
    half_b.update({{0, g.narrow(0, 2816, 2816)}}, 1e-2);
  }
  EXPECT_TRUE(at::equal(at::cat({p_a, p_b}), p_full));
  EXPECT_TRUE(at::equal(at::cat({half_a.exp_avg(0), half_b.exp_avg(0)}), whole.exp_avg(0)));
  EXPECT_TRUE(at::equal(at::cat({half_a.exp_avg_sq(0), half_b.exp_avg_sq(0)}), whole.exp_avg_sq(0)));
  EXPECT_EQ(half_a.state_bytes() + half_b.state_bytes(), whole.state_bytes());
}

// A non-finite gradient element zeroes that element's moments and leaves its parameter as it
// was; its block's other elements update normally.
TEST(AdamW8bit, NonFiniteGradientZeroesThatElementsState) {
  UnitLayout u;
  u.name = "u";
  u.slots = {{"w", {4096}, 0, 4096, false, 0.0}};
  u.group_begins = {0};
  u.numel = 4096;
  at::Tensor p = at::ones({4096});
  AdamW8bit opt({{"u", p, 0, 0}}, {Blocking::of(u, 0, 4096, 4096)}, {});
  opt.begin_step();
  opt.update({{0, at::full({4096}, 0.5)}}, 1e-2);
  at::Tensor before = p.clone(), g = at::full({4096}, 0.5);
  g[3] = NAN;
  g[700] = INFINITY;
  opt.begin_step();
  opt.update({{0, g}}, 1e-2);
  for (int64_t i : {3, 700}) {
    EXPECT_EQ(p[i].item<float>(), before[i].item<float>());
    EXPECT_EQ(opt.exp_avg(0)[i].item<float>(), 0.0f);
    EXPECT_EQ(opt.exp_avg_sq(0)[i].item<float>(), 0.0f);
  }
  EXPECT_LT(p[4].item<float>(), before[4].item<float>());
  EXPECT_TRUE(at::all(at::isfinite(p)).item<bool>());
}

// State bytes: 2 x (1 code byte + 4/256 absmax bytes) per element, float32 moments for groups
// under min_8bit_numel.
TEST(AdamW8bit, StateBytesPerElement) {
  UnitLayout u = two_tensor_unit();
  Blocking b = Blocking::of(u, 0, 5632, 4096);
  EXPECT_EQ(b.n_fp32, 2);  // the 300-element tensor's two blocks
  EXPECT_EQ(b.state_bytes(), 2 * (5632 + 5632 / 256 * 4 + 2 * 256 * 4));
}

TEST(AdamW8bit, CudaKernelMatchesCpuReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  UnitLayout u = two_tensor_unit();
  at::manual_seed(11);
  for (bool bf16 : {false, true}) {
    const auto dt = bf16 ? at::kBFloat16 : at::kFloat;
    at::Tensor pc = to_unit(at::randn({5300})).to(dt), pg = pc.cuda();
    AdamW8bitOptions o{{0.9, 0.95, 1e-8, 0.1, bf16, 5}, 4096};
    AdamW8bit cpu({{"u", pc, 5632, 0}}, {Blocking::of(u, 0, 5632, 4096)}, o);
    AdamW8bit gpu({{"u", pg, 5632, 0}}, {Blocking::of(u, 0, 5632, 4096)}, o);
    for (int s = 0; s < 10; ++s) {
      at::Tensor g = to_unit(at::randn({5300})).to(dt);
      cpu.begin_step();
      gpu.begin_step();
      cpu.update({{0, g}}, 1e-2);
      gpu.update({{0, g.cuda()}}, 1e-2);
    }
    // Float32 math on both sides (the GPU contracts to FMA): parameters within 1e-6 relative;
    // state codes may differ where a moment sits within rounding of a midpoint.
    at::Tensor diff = (pg.cpu().to(at::kFloat) - pc.to(at::kFloat)).abs();
    const double tol = bf16 ? 1.0 / 128 : 1e-6;
    EXPECT_TRUE(at::all(diff <= pc.to(at::kFloat).abs() * tol + 1e-7).item<bool>()) << (bf16 ? "bf16" : "fp32");
    EXPECT_LE((gpu.exp_avg(0) - cpu.exp_avg(0)).abs().max().item<double>(),
              1e-3 * cpu.exp_avg(0).abs().max().item<double>());
  }
}
