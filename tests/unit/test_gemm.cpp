// CPU bf16 GEMMs run as float32 GEMMs of the (exactly widened) bf16 operands, rounded once:
// the float64 product of the same bf16 values rounded to bf16 is the reference, and the
// gradients flow in bf16 like any bf16 linear.
#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include "model/gemm.h"

using namespace ptrain;

TEST(Gemm, CpuBf16LinearIsFloat32AccumulationRoundedOnce) {
  at::manual_seed(3);
  at::Tensor x = at::randn({2, 16, 96}).to(at::kBFloat16).requires_grad_();
  at::Tensor w = at::randn({40, 96}).to(at::kBFloat16).requires_grad_();
  at::Tensor y = gemm::linear(x, w);
  ASSERT_EQ(y.scalar_type(), at::kBFloat16);
  at::Tensor ref = at::linear(x.detach().to(at::kDouble), w.detach().to(at::kDouble));
  // One rounding of a float32-accurate value: within half a bf16 ulp (2^-9 relative) plus
  // float32 accumulation error.
  at::Tensor err = (y.detach().to(at::kDouble) - ref).abs();
  EXPECT_TRUE(at::all(err <= ref.abs() * (1.0 / 256) + 1e-4).item<bool>()) << err.max().item<double>();

  y.sum().backward();
  ASSERT_EQ(x.grad().scalar_type(), at::kBFloat16);
  ASSERT_EQ(w.grad().scalar_type(), at::kBFloat16);
  at::Tensor gx = at::ones({2, 16, 40}, at::kDouble).matmul(w.detach().to(at::kDouble));
  EXPECT_TRUE(at::allclose(x.grad().to(at::kDouble), gx, 1.0 / 128, 1e-3));
}

TEST(Gemm, MmHonoursOutDtype) {
  at::Tensor a = at::randn({8, 12}).to(at::kBFloat16), b = at::randn({12, 5}).to(at::kBFloat16);
  at::Tensor f = gemm::mm(a, b, at::kFloat);
  EXPECT_EQ(f.scalar_type(), at::kFloat);
  EXPECT_TRUE(at::allclose(f, at::mm(a.to(at::kFloat), b.to(at::kFloat))));
  EXPECT_EQ(gemm::mm(a, b, at::kBFloat16).scalar_type(), at::kBFloat16);
}

// Operands of different dtypes (a float32 gradient times bf16 activations, as the output
// adapter's gradient is formed) multiply in float32 on every device: on the CPU and on CUDA
// the product of the float32 operand and the exactly widened bf16 one.
TEST(Gemm, CudaMixedOperandsMultiplyInTheWiderDtype) {
  if (!torch::cuda::is_available())
    GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA matmul paths run on the GPU machine";
  at::manual_seed(4);
  const at::Tensor a = at::randn({9, 37}), b = at::randn({37, 5}).to(at::kBFloat16);
  const at::Tensor ref = at::mm(a, b.to(at::kFloat));
  const at::Tensor cpu = gemm::mm(a, b, at::kFloat), gpu = gemm::mm(a.cuda(), b.cuda(), at::kFloat).cpu();
  EXPECT_TRUE(at::allclose(cpu, ref, 1e-5, 1e-6));
  EXPECT_TRUE(at::allclose(gpu, ref, 1e-5, 1e-6));
  EXPECT_EQ(gemm::mm(b.t().contiguous().cuda(), a.t().contiguous().cuda(), at::kBFloat16).scalar_type(), at::kBFloat16);
}

// The loss's float32 gradient accumulators: acc += a @ b in one cuBLAS call on CUDA (bf16
// operands), the same sums as the float32 reference on every device and dtype.
TEST(Gemm, CudaAndCpuAccumulateIntoFloat32) {
  at::manual_seed(5);
  const at::Tensor acc0 = at::randn({37, 19}), a = at::randn({37, 23}), b = at::randn({23, 19});
  std::vector<c10::Device> devices{c10::Device(c10::kCPU)};
  if (torch::cuda::is_available()) devices.emplace_back(c10::kCUDA, 0);
  for (const auto& device : devices)
    for (const auto dtype : {at::kFloat, at::kBFloat16}) {
      const at::Tensor x = a.to(dtype), y = b.t().contiguous().to(dtype).t();  // a transposed operand, as in backward
      const at::Tensor ref = acc0 + at::mm(x.to(at::kFloat), y.to(at::kFloat));
      at::Tensor acc = acc0.to(device, /*non_blocking=*/false, /*copy=*/true);
      const void* storage = acc.data_ptr();
      gemm::add_mm_(acc, x.to(device), y.to(device));
      EXPECT_EQ(acc.data_ptr(), storage) << device << " " << dtype;  // accumulated in place
      EXPECT_TRUE(at::allclose(acc.cpu(), ref, 1e-4, 1e-4)) << device << " " << dtype;
    }
  if (!torch::cuda::is_available())
    GTEST_SKIP()
        << "no CUDA GPU on this machine: the CPU cases passed, the cuBLAS accumulation runs on the GPU machine";
}
