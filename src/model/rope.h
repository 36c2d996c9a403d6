// RoPE's rotation of each head's (first half, second half) pairs, in two forms selected by
// kernels.fused_rope:
//   composite — LibTorch's operations in float32 (a float32 copy of x, its halves, four products,
//               a sum, a difference, a concatenation, the cast back): about ten kernels each way;
//   fused     — one autograd function: on CUDA one kernel each way (kernels/rope.cu), elsewhere the
//               composite path's own operations, so its values and gradients equal the composite
//               path's bit for bit (the kernel's CPU reference).
// Neither keeps an activation for backward (only the shared cos/sin tables).
#pragma once
#include <ATen/Tensor.h>

namespace ptrain {

// x: [B, T, heads, head_dim]; cos, sin: float32 [1 or B, T, 1, head_dim/2] (broadcast over
// heads, and over B when it is 1). Returns the rotated x in x's dtype (contiguous when fused).
at::Tensor rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused);

// The fused function's two passes without autograd, by the CUDA kernel on a float32 / bfloat16
// CUDA tensor and by the reference elsewhere (tests compare the two). The backward pass rotates
// grad (x's shape) back and returns it in `dtype`, x's.
at::Tensor rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_backward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin, c10::ScalarType dtype);
// The same passes by the reference (LibTorch's operations) on any device.
at::Tensor rope_forward_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);
at::Tensor rope_backward_reference(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin,
                                   c10::ScalarType dtype);

}  // namespace ptrain
