// RoPE forward and backward: one thread per (row, head, pair) rotating the pair (i, i + half) of
// one head by its position's angle, in float32 with each product and sum rounded on its own
// (__fmul_rn / __fadd_rn / __fsub_rn: no contraction into FMAs), so that float32 results equal the
// composite path's bit for bit. Nothing is kept between the passes but the shared tables.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include "cuda_check.h"
#include "element_access.cuh"
#include "rope_cuda.h"

namespace ptrain::kernels {

namespace {

// The element offsets of pair i's two halves in x (row stride `row_stride`) and of its angle in
// the tables.
struct PairAt {
  int64_t x1, x2, angle;
};
__device__ inline PairAt pair_at(const RopeShape& s, int64_t i, int64_t row_stride) {
  const int64_t half = s.head_dim / 2;
  const int64_t j = i % half, head = (i / half) % s.heads, row = i / (half * s.heads);
  const int64_t x1 = row * row_stride + head * s.head_dim + j;
  const int64_t table_row = s.table_period > 0 ? row % s.table_period : row;
  return {x1, x1 + half, table_row * half + j};
}

// sign +1: the forward rotation by the angle; -1: the backward one, by minus the angle.
template <class T, int sign>
__global__ void rotate_kernel(RopeShape s, int64_t in_row_stride, const T* __restrict__ in,
                              const float* __restrict__ cos, const float* __restrict__ sin, T* __restrict__ out) {
  const int64_t pairs = s.rows * s.heads * (s.head_dim / 2), out_row_stride = s.heads * s.head_dim;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < pairs;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const PairAt src = pair_at(s, i, in_row_stride), dst = pair_at(s, i, out_row_stride);
    const float a = load(in, src.x1), b = load(in, src.x2), c = cos[src.angle], sn = sin[src.angle];
    if (sign > 0) {
      store(out, dst.x1, __fsub_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
      store(out, dst.x2, __fadd_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
    } else {
      store(out, dst.x1, __fadd_rn(__fmul_rn(a, c), __fmul_rn(b, sn)));
      store(out, dst.x2, __fsub_rn(__fmul_rn(b, c), __fmul_rn(a, sn)));
    }
  }
}

template <int sign>
void launch(const RopeShape& s, int64_t in_row_stride, const void* in, const float* cos, const float* sin, void* out,
            void* stream) {
  const int64_t pairs = s.rows * s.heads * (s.head_dim / 2);
  if (pairs == 0) return;
  const int threads = 256;
  auto st = static_cast<cudaStream_t>(stream);
  if (s.bf16)
    rotate_kernel<__nv_bfloat16, sign><<<grid_for(pairs, threads), threads, 0, st>>>(
        s, in_row_stride, static_cast<const __nv_bfloat16*>(in), cos, sin, static_cast<__nv_bfloat16*>(out));
  else
    rotate_kernel<float, sign><<<grid_for(pairs, threads), threads, 0, st>>>(
        s, in_row_stride, static_cast<const float*>(in), cos, sin, static_cast<float*>(out));
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace

void rope_forward(const RopeShape& s, const void* x, const float* cos, const float* sin, void* out, void* stream) {
  launch<1>(s, s.x_row_stride, x, cos, sin, out, stream);
}

void rope_backward(const RopeShape& s, const void* grad, const float* cos, const float* sin, void* dx, void* stream) {
  launch<-1>(s, s.heads * s.head_dim, grad, cos, sin, dx, stream);
}

}  // namespace ptrain::kernels
