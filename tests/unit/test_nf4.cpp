// NF4 quantization against bitsandbytes 0.50.2 (tests/fixtures/make_bnb_fixtures.py): packed
// codes, absmax, double-quantized statistics and dequantized weights bit for bit, for a size
// with a short last block and an odd count and for one with two double-quant blocks.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "checkpoint/safetensors.h"
#include "quant/nf4.h"
#include "quant/nf4_math.h"
#include "test_util.h"

using namespace ptrain;

namespace {
SafetensorsFile& bnb() {
  static SafetensorsFile f(test::fixture("bitsandbytes.safetensors"));
  return f;
}
}  // namespace

TEST(Nf4, CodeMatchesBitsandbytes) {
  EXPECT_TRUE(at::equal(at::from_blob(const_cast<float*>(nf4::kCode), {16}, at::kFloat), bnb().tensor("nf4_code")));
}

TEST(Nf4, QuantizeBitIdenticalToBitsandbytes) {
  for (const std::string name : {"small", "big"}) {
    const std::string k = "nf4_" + name + "_";
    at::Tensor w = bnb().tensor(k + "w");
    nf4::Quantized q = nf4::quantize(w, false);
    EXPECT_TRUE(at::equal(q.packed, bnb().tensor(k + "packed"))) << name;
    EXPECT_TRUE(at::equal(q.absmax, bnb().tensor(k + "absmax"))) << name;
    EXPECT_TRUE(at::equal(nf4::dequantize(q, at::kFloat), bnb().tensor(k + "dq"))) << name;

    nf4::Quantized d = nf4::quantize(w, true);
    EXPECT_TRUE(at::equal(d.packed, q.packed)) << name;
    EXPECT_TRUE(at::equal(d.absmax, bnb().tensor(k + "qabsmax"))) << name;
    EXPECT_TRUE(at::equal(d.absmax2, bnb().tensor(k + "absmax2"))) << name;
    EXPECT_EQ(d.offset, bnb().tensor(k + "offset").item<float>()) << name;
    EXPECT_TRUE(at::equal(nf4::dequantize(d, at::kFloat), bnb().tensor(k + "dq2"))) << name;
  }
}

// Closed-form error bound: each weight lands on the nearest code of its block, so the error is
// at most half the widest code gap (0.3038 between -1 and -0.6962) times the block's absmax;
// double quantization adds the 8-bit error of the absmax itself.
TEST(Nf4, DequantizationErrorBound) {
  at::manual_seed(8);
  at::Tensor w = at::randn({1000, 64}) * 0.02;
  nf4::Quantized q = nf4::quantize(w, false);
  at::Tensor absmax = nf4::block_absmax(q).repeat_interleave(nf4::kBlock);
  at::Tensor err = (nf4::dequantize(q, at::kFloat) - w).abs().reshape({-1});
  const float half_gap = (nf4::kCode[1] - nf4::kCode[0]) / 2;
  EXPECT_TRUE(at::all(err <= absmax * half_gap * (1 + 1e-6)).item<bool>());
  EXPECT_LT(err.mean().item<double>(), 0.1 * absmax.mean().item<double>());
  // Bytes: 4 bits per weight plus 4 bytes per 64 (0.5625 B/weight); with double quantization
  // 1 byte per 64 plus 4 per 16384 and the offset (~0.516 B/weight).
  EXPECT_EQ(q.bytes(), 64000 / 2 + 1000 * 4);
  nf4::Quantized d = nf4::quantize(w, true);
  EXPECT_EQ(d.bytes(), 64000 / 2 + 1000 + 4 * 4 + 4);
  at::Tensor err2 = (nf4::dequantize(d, at::kFloat) - w).abs();
  EXPECT_LT(err2.mean().item<double>(), 1.02 * err.mean().item<double>());
}

TEST(Nf4, CudaDequantizeMatchesCpuReference) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the kernel comparison runs on the GPU machine";
  for (bool dq : {false, true}) {
    at::Tensor w = bnb().tensor("nf4_big_w");
    nf4::Quantized c = nf4::quantize(w, dq), g = nf4::quantize(w.cuda(), dq);
    EXPECT_TRUE(at::equal(nf4::dequantize(g, at::kFloat).cpu(), nf4::dequantize(c, at::kFloat))) << dq;
    EXPECT_TRUE(at::equal(nf4::dequantize(g, at::kBFloat16).cpu(), nf4::dequantize(c, at::kBFloat16))) << dq;
  }
  // Both of the kernel's paths: eight elements per thread (a multiple of 8, fresh aligned
  // buffers) and one byte per thread (an odd length; an output 2 or 4 bytes past alignment) —
  // every 64-block and 256-block boundary, the last partial block included.
  at::manual_seed(9);
  for (const int64_t n : {int64_t{64 * 256 * 3}, int64_t{64 * 300 + 8}, int64_t{64 * 300 + 5}, int64_t{1003}})
    for (bool dq : {false, true}) {
      SCOPED_TRACE(std::to_string(n) + (dq ? " elements, double quantization" : " elements"));
      const nf4::Quantized c = nf4::quantize(at::randn({n}), dq);
      nf4::Quantized g = c;  // the same bytes on the GPU
      g.packed = c.packed.cuda();
      g.absmax = c.absmax.cuda();
      if (c.absmax2.defined()) g.absmax2 = c.absmax2.cuda();
      for (const auto dtype : {at::kFloat, at::kBFloat16}) {
        const at::Tensor want = nf4::dequantize(c, dtype);
        EXPECT_TRUE(at::equal(nf4::dequantize(g, dtype).cpu(), want)) << c10::toString(dtype);
        const at::Tensor buffer = at::zeros({n + 1}, at::TensorOptions().device(at::kCUDA).dtype(dtype));
        nf4::dequantize_into(g, buffer.narrow(0, 1, n));  // not 16-byte aligned
        EXPECT_TRUE(at::equal(buffer.narrow(0, 1, n).cpu(), want)) << c10::toString(dtype) << ", misaligned";
        EXPECT_EQ(buffer[0].item<float>(), 0.0f) << "the element before the output was written";
      }
    }
}
