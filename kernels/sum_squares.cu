// Sum of squares in float64 over float32 / bfloat16 elements: a grid-stride pass whose blocks each
// write one partial (a fixed tree in shared memory), then one block summing the partials the same
// way. The grid depends on n only: deterministic.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>

#include "cuda_check.h"
#include "element_access.cuh"
#include "sum_squares_cuda.h"

namespace ptrain::kernels {

namespace {

constexpr int kThreads = 256;

__device__ double square(float x) { return static_cast<double>(x) * static_cast<double>(x); }

// The block's values summed over a fixed tree; thread 0 gets the total.
__device__ double block_sum(double v) {
  __shared__ double shared[kThreads];
  shared[threadIdx.x] = v;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride /= 2) {
    if (threadIdx.x < stride) shared[threadIdx.x] += shared[threadIdx.x + stride];
    __syncthreads();
  }
  return shared[0];
}

template <class T>
__global__ void partial_kernel(const T* __restrict__ data, int64_t n, double* __restrict__ partial) {
  double acc = 0.0;
  for (int64_t i = blockIdx.x * static_cast<int64_t>(kThreads) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * kThreads)
    acc += square(load(data, i));
  const double total = block_sum(acc);
  if (threadIdx.x == 0) partial[blockIdx.x] = total;
}

__global__ void final_kernel(const double* __restrict__ partial, int blocks, double* __restrict__ out) {
  double acc = 0.0;
  for (int i = threadIdx.x; i < blocks; i += kThreads) acc += partial[i];
  const double total = block_sum(acc);
  if (threadIdx.x == 0) *out = total;
}

}  // namespace

void sum_squares_f64(const void* data, int64_t n, bool bf16, double* scratch, double* out, void* stream) {
  auto st = static_cast<cudaStream_t>(stream);
  const int blocks = static_cast<int>(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, kSumSquaresBlocks));
  if (bf16)
    partial_kernel<<<blocks, kThreads, 0, st>>>(static_cast<const __nv_bfloat16*>(data), n, scratch);
  else
    partial_kernel<<<blocks, kThreads, 0, st>>>(static_cast<const float*>(data), n, scratch);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
  final_kernel<<<1, kThreads, 0, st>>>(scratch, blocks, out);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
