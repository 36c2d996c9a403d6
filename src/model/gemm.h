// Matrix products in the compute dtype with the GPU's numerics on every device.
//
// A bf16 GEMM on a GPU multiplies bf16 operands, accumulates in float32 and rounds the result
// once. CPUs without bf16 matrix units run ATen's bf16 GEMMs 6x (contiguous) to 50x
// (transposed operands, as in backward) slower than float32, so on the CPU these helpers widen
// bf16/fp16 operands to float32 — exact — multiply in float32 and round the result to the
// requested dtype: the same numbers a GPU produces, at float32 GEMM speed. The price is a
// float32 copy of each reduced-precision operand while it is in use (and, for `linear` under
// autograd, of its saved input). Float32 inputs and CUDA tensors take the plain ATen call.
#pragma once
#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

namespace ptrain::gemm {

// x [..., in] @ w[out, in]^T (+ bias [out], added before the result is rounded, as a GPU's
// GEMM epilogue does), differentiable, result in x's dtype.
at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias = at::Tensor());

// a [n, k] @ b [k, m] with float32 accumulation, result in `out_dtype` (no autograd). Operands
// of different dtypes multiply in the wider one (float32 x bf16: in float32), on every device.
at::Tensor mm(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype);

// acc += a @ b with acc in float32 and a, b in one dtype: on CUDA one cuBLAS call that reads
// acc and accumulates into it (beta = 1), where mm + add_ writes a float32 product of acc's
// size and then reads both — for the output projection's gradient, summed over the loss's
// chunks, that pass over [vocab, dim] float32 cost more than the matmul itself.
void add_mm_(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b);

}  // namespace ptrain::gemm
