// QLoRA building blocks: the 4-bit linear keeps no dequantized weight in the autograd graph
// (bytes measured by the allocator), LoRA starts as the identity on the base layer, and its
// gradients equal a dense reference that uses the dequantized weight as a frozen fp32 matrix.
#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>
#include <gtest/gtest.h>

#include <atomic>
#include <memory>

#include "checkpoint/hf.h"
#include "common/alloc_meter.h"
#include "model/layout.h"
#include "model/linear4bit.h"
#include "parallel/fsdp.h"
#include "parallel/weights.h"
#include "quant/nf4.h"
#include "test_util.h"

using namespace ptrain;

namespace {

struct Layers {
  std::vector<std::shared_ptr<const nf4::Quantized>> w4;
  std::vector<at::Tensor> dense;  // the dequantized weights, for references
};

Layers make_layers(int n, int64_t dim) {
  Layers l;
  at::manual_seed(21);
  for (int i = 0; i < n; ++i) {
    auto q =
        std::make_shared<const nf4::Quantized>(nf4::quantize(at::randn({dim, dim}) / std::sqrt(double(dim)), true));
    l.dense.push_back(nf4::dequantize(*q, at::kFloat));
    l.w4.push_back(std::move(q));
  }
  return l;
}
}  // namespace

// Forward through N frozen 4-bit layers: the graph holds what a chain of N linears must (each
// layer's activation) and nothing weight-sized, while a naive linear that saves its
// dequantized W holds N extra weights.
TEST(Qlora, FourBitLinearHoldsNoDequantizedWeight) {
  const int n = 6;
  const int64_t dim = 512, tokens = 8;
  Layers l = make_layers(n, dim);
  const int64_t weight_bytes = dim * dim * 4, act_bytes = tokens * dim * 4;
  auto held = [&](bool naive) {
    at::Tensor x = at::randn({tokens, dim}).requires_grad_();
    auto meter = std::make_shared<AllocationMeter>();
    at::Tensor y;
    {
      c10::DebugInfoGuard guard(c10::DebugInfoKind::PROFILER_STATE, meter);
      y = x;
      for (int i = 0; i < n; ++i)
        y = at::tanh(naive ? at::linear(y, nf4::dequantize(*l.w4[i], at::kFloat)) : linear4bit(y, l.w4[i]));
    }
    const int64_t bytes = meter->net.load();
    y.sum().backward();
    EXPECT_TRUE(x.grad().defined());
    return bytes;
  };
  const int64_t ours = held(false), naive = held(true);
  std::printf("held after forward: 4-bit %lld bytes, naive %lld bytes (one weight %lld)\n", (long long)ours,
              (long long)naive, (long long)weight_bytes);
  // Per layer: the linear's output and tanh's output (2 activations); never a weight.
  EXPECT_LE(ours, 2 * n * act_bytes + 4096) << "bytes held after forward";
  EXPECT_GE(naive, ours + n * weight_bytes) << "the naive version should hold every dequantized weight";
}

TEST(Qlora, FourBitLinearGradientsMatchDenseReference) {
  Layers l = make_layers(1, 96);
  at::Tensor x = at::randn({4, 5, 96}).requires_grad_(), xr = x.detach().clone().requires_grad_();
  at::Tensor y = linear4bit(x, l.w4[0]), yr = at::linear(xr, l.dense[0]);
  EXPECT_TRUE(at::allclose(y, yr, 1e-5, 1e-6));
  at::Tensor g = at::randn(y.sizes());
  y.backward(g);
  yr.backward(g);
  EXPECT_TRUE(at::allclose(x.grad(), xr.grad(), 1e-5, 1e-6));
}

// Step 0: the trainer's adapter init (FsdpModel::init_adapters) draws A ~ U(-1/sqrt(in),
// 1/sqrt(in)) and B = 0, so base + LoRA equals the base layer exactly; then the adapter's
// gradients through the forward's own delta (BlockLora) equal those of a dense float32 reference
// with the dequantized weight frozen.
TEST(Qlora, LoraStartsAsBaseAndItsGradientsMatchDense) {
  Layers l = make_layers(1, 64);
  LlamaShape s = test::small_shape();  // dim 64
  LoraOptions options;
  options.enabled = true;
  options.targets = {"q"};
  options.rank = 8;
  FsdpModel model(test::plan(s, {}, options), PrecisionPolicy{}, at::kCPU, test::local_comm());
  init_adapters(model, 4);
  const FlatUnit& adapters = model.trained_units().at(1);
  at::Tensor a = slot_view(adapters.shard.detach(), adapters.layout.slots.at(0)).clone();
  at::Tensor b = slot_view(adapters.shard.detach(), adapters.layout.slots.at(1)).clone();
  ASSERT_EQ(a.sizes(), (std::vector<int64_t>{8, 64}));
  EXPECT_LE(a.abs().max().item<double>(), 1.0 / 8.0);  // U(-1/sqrt(64), 1/sqrt(64))
  EXPECT_GT(a.abs().max().item<double>(), 0.1);
  EXPECT_EQ(b.abs().max().item<double>(), 0.0);
  BlockLora lora;
  lora.scale = 16.0 / 8;
  lora.a[0] = a, lora.b[0] = b;
  at::Tensor x = at::randn({3, 7, 64});
  EXPECT_TRUE(at::equal(linear4bit(x, l.w4[0]) + lora.delta(Proj::q, x), linear4bit(x, l.w4[0])));

  b.normal_(0, 0.1);  // a trained adapter
  at::Tensor a1 = a.clone().requires_grad_(), b1 = b.clone().requires_grad_();
  at::Tensor a2 = a.clone().requires_grad_(), b2 = b.clone().requires_grad_();
  lora.a[0] = a1, lora.b[0] = b1;
  at::Tensor y1 = linear4bit(x, l.w4[0]) + lora.delta(Proj::q, x);
  at::Tensor y2 = at::linear(x, l.dense[0]) + at::linear(at::linear(x, a2), b2) * lora.scale;
  at::Tensor g = at::randn(y1.sizes());
  y1.backward(g);
  y2.backward(g);
  EXPECT_TRUE(at::allclose(y1, y2, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(a1.grad(), a2.grad(), 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(b1.grad(), b2.grad(), 1e-5, 1e-6));
}

// Loading an HF checkpoint into an NF4 base quantizes one projection at a time: host
// allocations during the load peak at a few copies of the largest projection plus the NF4
// weights, never at the checkpoint's full-precision matrices (measured with the allocation meter).
TEST(Qlora, HfLoadQuantizesOneProjectionAtATime) {
  const std::string dir = test::fixture("hf_tiny");
  const LlamaShape shape = read_hf_config(dir);
  LoraOptions lora;
  lora.enabled = true;
  lora.targets = {"q"};
  QuantOptions quant;
  quant.base = QuantBase::nf4;
  FsdpModel m(test::plan(shape, {}, lora, quant), PrecisionPolicy{}, at::kCPU, test::local_comm());
  HfCheckpoint ckpt(dir);
  int64_t peak = 0;
  {
    MeterScope scope;
    load_weights(m, ckpt.by_name());
    peak = scope.meter().peak.load();
  }
  int64_t matrices = 0, largest = 0;
  for (const auto& u : llama_units(shape, 0.02))
    if (u.kind == UnitKind::block)
      for (const auto& g : block_matrix_groups(u))
        for (const auto& s : g) {
          matrices += s.numel;
          largest = std::max(largest, s.numel);
        }
  std::printf("HF load: peak host allocation %lld B; largest projection %lld B in float32; all block matrices %lld B\n",
              (long long)peak, (long long)largest * 4, (long long)matrices * 4);
  EXPECT_GT(peak, 0);
  EXPECT_LE(peak, 3 * largest * 4 + m.nf4_bytes());
  EXPECT_LT(peak, matrices * 4 / 2);
  EXPECT_EQ(m.plan().nf4_params(), matrices);
}
