// The sum of squares of a gradient in float64 without a float64 copy of it, on the GPU; the CPU
// reference is the composite path in src/parallel/grad_norm.cpp (tests/unit/test_kernels.cpp).
#pragma once
#include <cstdint>

namespace ptrain::kernels {

// Partial sums per block, then one block summing them: an order fixed by n alone, so the same
// gradient gives the same bits every run.
constexpr int kSumSquaresBlocks = 1024;

// *out (device memory) = sum of data[i]^2 over n float32 (bf16 = false) or bfloat16 elements,
// each square and every sum in float64. scratch: kSumSquaresBlocks doubles of device memory.
// `stream` is a cudaStream_t.
void sum_squares_f64(const void* data, int64_t n, bool bf16, double* scratch, double* out, void* stream);

}  // namespace ptrain::kernels
