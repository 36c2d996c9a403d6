// Softmax cross-entropy of a chunk of logits, loss and gradient in one kernel: one block per row
// reads the row once for its maximum and sum of exponentials together (the online softmax: the
// sum rescaled when the maximum grows), then once more to write the gradient — where the
// composite path makes a logsumexp, a gather, an in-place subtraction and exponential, a scatter,
// a scaling and a cast, each a pass over the [rows, vocab] float32 chunk.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>

#include "cuda_check.h"
#include "element_access.cuh"
#include "softmax_xent_cuda.h"

namespace ptrain::kernels {

namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;

// (max, sum of exp(x - max)) of two parts combined.
struct MaxSum {
  float max, sum;
};
__device__ inline MaxSum combine(MaxSum a, MaxSum b) {
  if (a.max == -INFINITY) return b;
  if (b.max == -INFINITY) return a;
  const float m = fmaxf(a.max, b.max);
  return {m, a.sum * expf(a.max - m) + b.sum * expf(b.max - m)};
}

__device__ inline MaxSum block_max_sum(MaxSum v) {
  __shared__ MaxSum warps[kWarps];
  for (int offset = 16; offset > 0; offset /= 2)
    v = combine(v, {__shfl_xor_sync(0xffffffffu, v.max, offset), __shfl_xor_sync(0xffffffffu, v.sum, offset)});
  if (threadIdx.x % 32 == 0) warps[threadIdx.x / 32] = v;
  __syncthreads();
  MaxSum total = warps[0];
  for (int w = 1; w < kWarps; ++w) total = combine(total, warps[w]);  // every thread, the same order
  return total;
}

template <class TL, class TG>
__global__ void xent_kernel(XentShape s, const TL* logits, const int64_t* __restrict__ targets,
                            float* __restrict__ row_loss, TG* grad) {
  const int64_t r = blockIdx.x, base = r * s.vocab;
  MaxSum mine{-INFINITY, 0.0f};
  for (int64_t j = threadIdx.x; j < s.vocab; j += kThreads) {
    const float x = load(logits, base + j);
    if (x == -INFINITY) continue;
    if (x > mine.max) {
      mine.sum = mine.sum * expf(mine.max - x) + 1.0f;
      mine.max = x;
    } else {
      mine.sum += expf(x - mine.max);
    }
  }
  const MaxSum all = block_max_sum(mine);
  const float lse = all.max + logf(all.sum);
  const int64_t target = targets[r];
  const bool valid = target >= 0;
  if (threadIdx.x == 0) row_loss[r] = valid ? lse - load(logits, base + target) : 0.0f;
  if (grad == nullptr) return;
  __syncthreads();  // thread 0 read logits[target] before anyone overwrites it (grad may be logits)
  for (int64_t j = threadIdx.x; j < s.vocab; j += kThreads) {
    float g = 0.0f;
    if (valid) {
      const float p = expf(__fsub_rn(load(logits, base + j), lse));
      g = __fmul_rn(j == target ? __fsub_rn(p, 1.0f) : p, s.scale);
    }
    store(grad, base + j, g);
  }
}

template <class TL>
void launch_for_logits(const XentShape& s, const TL* logits, const int64_t* targets, float* row_loss, void* grad,
                       cudaStream_t st) {
  if (s.grad_bf16)
    xent_kernel<TL, __nv_bfloat16><<<static_cast<unsigned>(s.rows), kThreads, 0, st>>>(
        s, logits, targets, row_loss, static_cast<__nv_bfloat16*>(grad));
  else
    xent_kernel<TL, float>
        <<<static_cast<unsigned>(s.rows), kThreads, 0, st>>>(s, logits, targets, row_loss, static_cast<float*>(grad));
}

}  // namespace

void softmax_xent(const XentShape& s, const void* logits, const int64_t* targets, float* row_loss, void* grad,
                  void* stream) {
  if (s.rows == 0) return;
  auto st = static_cast<cudaStream_t>(stream);
  if (s.logits_bf16)
    launch_for_logits(s, static_cast<const __nv_bfloat16*>(logits), targets, row_loss, grad, st);
  else
    launch_for_logits(s, static_cast<const float*>(logits), targets, row_loss, grad, st);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
