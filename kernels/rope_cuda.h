// Rotary position embedding on the GPU, forward and backward in one pass each; the CPU reference
// is the composite path in src/model/rope.cpp (tests/unit/test_kernels.cpp compares the two).
#pragma once
#include <cstdint>

namespace ptrain::kernels {

// x: [rows, heads, head_dim] with unit element stride, heads `head_dim` apart and rows
// `x_row_stride` elements apart (a view of the q/k/v projection's output, or a tensor of its own);
// out: contiguous [rows, heads, head_dim]. cos, sin: contiguous float32 [table_rows, head_dim/2];
// row r reads table row r % table_period (positions 0..T-1 repeating per sequence), or row r
// itself when table_period is 0 (packed documents: a position per token). Elements are float32
// (bf16 = false) or bfloat16, rotated in float32 without fused multiply-adds (as the reference's
// separate products and sums round) and rounded once. `stream` is a cudaStream_t.
struct RopeShape {
  int64_t rows = 0, heads = 0, head_dim = 0, x_row_stride = 0, table_period = 0;
  bool bf16 = false;
};
// out = (x1 c - x2 s, x2 c + x1 s) for each head's halves (x1, x2)
void rope_forward(const RopeShape& s, const void* x, const float* cos, const float* sin, void* out, void* stream);
// dx = (g1 c + g2 s, g2 c - g1 s): the rotation back; grad and dx are contiguous
void rope_backward(const RopeShape& s, const void* grad, const float* cos, const float* sin, void* dx, void* stream);

}  // namespace ptrain::kernels
