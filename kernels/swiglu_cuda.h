// SwiGLU on the GPU, forward and backward in one pass each; the CPU reference is the autograd
// function in src/model/swiglu.cpp (tests/unit/test_kernels.cpp compares the two).
#pragma once
#include <cstdint>

namespace ptrain::kernels {

// gate and up: [rows, cols] with unit column stride and their own row strides (views of the
// gate/up projection's output, or tensors of their own); out, grad, dgate, dup: contiguous
// [rows, cols]. Elements are float32 (bf16 = false) or bfloat16, computed in float32 and rounded
// once. `stream` is a cudaStream_t.
struct SwigluShape {
  int64_t rows = 0, cols = 0, gate_stride = 0, up_stride = 0;
  bool bf16 = false;
};
// out = silu(gate) * up
void swiglu_forward(const SwigluShape& s, const void* gate, const void* up, void* out, void* stream);
// dgate = grad * up * silu'(gate), dup = grad * silu(gate), silu recomputed from gate
void swiglu_backward(const SwigluShape& s, const void* grad, const void* gate, const void* up, void* dgate, void* dup,
                     void* stream);

}  // namespace ptrain::kernels
