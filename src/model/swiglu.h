// SwiGLU's product, silu(gate) * up, in two forms selected by kernels.fused_swiglu:
//   composite — LibTorch's silu and mul; autograd keeps gate, silu's output and up;
//   fused     — one autograd function that keeps only gate and up and recomputes silu in
//               backward (one activation of [tokens, ffn_dim] less per block): on CUDA one kernel
//               each way (kernels/swiglu.cu), elsewhere the composite path's own operations, so
//               its values and gradients equal the composite path's bit for bit (the kernels'
//               CPU reference).
#pragma once
#include <ATen/Tensor.h>

namespace ptrain {

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, bool fused);

// The fused function's two passes without autograd, as the CUDA kernels compute them on a CUDA
// tensor and as the reference computes them elsewhere (tests compare the two). gate, up, grad:
// the same shape; float32 or bfloat16 on CUDA.
at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate, const at::Tensor& up);
// The same passes by the reference (LibTorch's operations) on any device.
at::Tensor swiglu_forward_reference(const at::Tensor& gate, const at::Tensor& up);
std::pair<at::Tensor, at::Tensor> swiglu_backward_reference(const at::Tensor& grad, const at::Tensor& gate,
                                                            const at::Tensor& up);

}  // namespace ptrain
