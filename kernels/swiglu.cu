// SwiGLU forward and backward: one thread per element, float32 arithmetic, silu recomputed in
// backward from gate (nothing but gate and up is kept between the passes).
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "element_access.cuh"
#include "swiglu_cuda.h"

namespace ptrain::kernels {

namespace {

template <class T>
__global__ void forward_kernel(SwigluShape s, const T* __restrict__ gate, const T* __restrict__ up,
                               T* __restrict__ out) {
  const int64_t n = s.rows * s.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / s.cols, c = i - r * s.cols;
    const float g = load(gate, r * s.gate_stride + c), u = load(up, r * s.up_stride + c);
    const float sig = 1.0f / (1.0f + expf(-g));
    store(out, i, g * sig * u);
  }
}

template <class T>
__global__ void backward_kernel(SwigluShape s, const T* __restrict__ grad, const T* __restrict__ gate,
                                const T* __restrict__ up, T* __restrict__ dgate, T* __restrict__ dup) {
  const int64_t n = s.rows * s.cols;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const int64_t r = i / s.cols, c = i - r * s.cols;
    const float dy = load(grad, i), g = load(gate, r * s.gate_stride + c), u = load(up, r * s.up_stride + c);
    const float sig = 1.0f / (1.0f + expf(-g));
    store(dgate, i, dy * u * sig * (1.0f + g * (1.0f - sig)));
    store(dup, i, dy * g * sig);
  }
}

}  // namespace

void swiglu_forward(const SwigluShape& s, const void* gate, const void* up, void* out, void* stream) {
  const int64_t n = s.rows * s.cols;
  if (n == 0) return;
  const int threads = 256;
  auto st = static_cast<cudaStream_t>(stream);
  if (s.bf16)
    forward_kernel<<<grid_for(n, threads), threads, 0, st>>>(s, static_cast<const __nv_bfloat16*>(gate),
                                                             static_cast<const __nv_bfloat16*>(up),
                                                             static_cast<__nv_bfloat16*>(out));
  else
    forward_kernel<<<grid_for(n, threads), threads, 0, st>>>(s, static_cast<const float*>(gate),
                                                             static_cast<const float*>(up), static_cast<float*>(out));
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

void swiglu_backward(const SwigluShape& s, const void* grad, const void* gate, const void* up, void* dgate, void* dup,
                     void* stream) {
  const int64_t n = s.rows * s.cols;
  if (n == 0) return;
  const int threads = 256;
  auto st = static_cast<cudaStream_t>(stream);
  if (s.bf16)
    backward_kernel<<<grid_for(n, threads), threads, 0, st>>>(
        s, static_cast<const __nv_bfloat16*>(grad), static_cast<const __nv_bfloat16*>(gate),
        static_cast<const __nv_bfloat16*>(up), static_cast<__nv_bfloat16*>(dgate), static_cast<__nv_bfloat16*>(dup));
  else
    backward_kernel<<<grid_for(n, threads), threads, 0, st>>>(
        s, static_cast<const float*>(grad), static_cast<const float*>(gate), static_cast<const float*>(up),
        static_cast<float*>(dgate), static_cast<float*>(dup));
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
