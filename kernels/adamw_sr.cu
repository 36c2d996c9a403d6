// Fused bf16 AdamW + stochastic rounding: one thread per element, grid-stride loop.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>

#include "adamw_sr_cuda.h"
#include "cuda_check.h"
#include "optim/sr_bits.h"

namespace ptrain::kernels {

namespace {
__device__ float bf16_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__device__ uint16_t float_to_bf16_nearest(float x) {
  const __nv_bfloat16 h = __float2bfloat16_rn(x);
  return *reinterpret_cast<const uint16_t*>(&h);
}

__global__ void adamw_sr_kernel(AdamWSrShard s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < s.n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = bf16_to_float(s.grad[i]);
    // The reference's order: m = lerp(m, g, 1 - beta1); v = beta2 * v + (1 - beta2) * g^2;
    // p *= 1 - lr * wd (decayed prefix); p -= step_size * m / (sqrt(v) / bc2 + eps).
    // lerp as ATen's CPU kernel computes it for a weight below 1/2: one fused multiply-add.
    float m = bf16_to_float(s.exp_avg[i]);
    m = fmaf(s.one_minus_beta1, g - m, m);
    const float v = bf16_to_float(s.exp_avg_sq[i]) * s.beta2 + s.one_minus_beta2 * g * g;
    float p = bf16_to_float(s.param[i]);
    if (i < s.decay_numel) p *= s.decay_factor;
    p -= s.step_size * (m / (sqrtf(v) / s.bias_correction2_sqrt + s.eps));
    s.param[i] = sr::round_bits(__float_as_uint(p), sr::hash(s.seed, s.global_offset + static_cast<uint64_t>(i)));
    s.exp_avg[i] = float_to_bf16_nearest(m);
    s.exp_avg_sq[i] = float_to_bf16_nearest(v);
  }
}
}  // namespace

void adamw_bf16_sr_step(const AdamWSrShard& shard, void* stream) {
  if (shard.n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((shard.n + threads - 1) / threads, 65535LL * 8);
  adamw_sr_kernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(shard);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
