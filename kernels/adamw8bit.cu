// AdamW8bit: one CUDA block per 256-element state block, one thread per element. The block
// dequantizes both moments, updates in float32 (q8::adam_element, shared with the CPU
// reference), reduces the new absmax in shared memory and requantizes by binary search over
// the float32 midpoints held in shared memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

#include "adamw8bit_cuda.h"
#include "cuda_check.h"
#include "optim/sr_bits.h"

namespace ptrain::kernels {

namespace {
constexpr int kThreads = static_cast<int>(q8::kBlock);

__device__ float block_max(float x, float* scratch) {
  scratch[threadIdx.x] = x;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (static_cast<int>(threadIdx.x) < stride)
      scratch[threadIdx.x] = fmaxf(scratch[threadIdx.x], scratch[threadIdx.x + stride]);
    __syncthreads();
  }
  const float r = scratch[0];
  __syncthreads();
  return r;
}

__global__ void __launch_bounds__(kThreads) adamw8bit_kernel(AdamW8bitShard s) {
  __shared__ float code_m[256], code_v[256], mids_m[255], mids_v[255], scratch[kThreads];
  const int tid = threadIdx.x;
  code_m[tid] = s.tables[tid];
  code_v[tid] = s.tables[256 + tid];
  if (tid < 255) {
    mids_m[tid] = s.tables[512 + tid];
    mids_v[tid] = s.tables[767 + tid];
  }
  __syncthreads();

  const int64_t b = blockIdx.x;
  const int64_t e = b * q8::kBlock + tid;
  const int32_t f = s.slot[b];
  float p, g;
  if (s.param_bf16) {
    p = __bfloat162float(static_cast<const __nv_bfloat16*>(s.param)[e]);
    g = __bfloat162float(static_cast<const __nv_bfloat16*>(s.grad)[e]);
  } else {
    p = static_cast<const float*>(s.param)[e];
    g = static_cast<const float*>(s.grad)[e];
  }
  const int64_t fe = static_cast<int64_t>(f) * q8::kBlock + tid;
  float m = f >= 0 ? s.m_fp32[fe] : code_m[s.m_codes[e]] * s.m_absmax[b];
  float v = f >= 0 ? s.v_fp32[fe] : code_v[s.v_codes[e]] * s.v_absmax[b];
  q8::adam_element(s.scalars, b < s.decay_blocks, g, p, m, v);

  if (!s.param_bf16) {
    static_cast<float*>(s.param)[e] = p;
  } else if (s.stochastic_rounding) {
    const uint16_t r = sr::round_bits(__float_as_uint(p), sr::hash(s.seed, s.global_offset + static_cast<uint64_t>(e)));
    static_cast<uint16_t*>(s.param)[e] = r;
  } else {
    static_cast<__nv_bfloat16*>(s.param)[e] = __float2bfloat16_rn(p);
  }

  if (f >= 0) {  // uniform per block: every thread takes the same branch
    s.m_fp32[fe] = m;
    s.v_fp32[fe] = v;
    return;
  }
  const float am = block_max(fabsf(m), scratch);
  const float av = block_max(v, scratch);
  if (tid == 0) {
    s.m_absmax[b] = am;
    s.v_absmax[b] = av;
  }
  s.m_codes[e] = static_cast<uint8_t>(q8::nearest_code(mids_m, q8::clamp_unit(m * q8::inverse_scale(am))));
  s.v_codes[e] = static_cast<uint8_t>(q8::nearest_code(mids_v, q8::clamp_unit(v * q8::inverse_scale(av))));
}
}  // namespace

void adamw8bit_step(const AdamW8bitShard& shard, void* stream) {
  if (shard.n_blocks == 0) return;
  if (shard.n_blocks > 0x7FFFFFFFLL) throw std::runtime_error("adamw8bit_step: shard too large for one grid");
  adamw8bit_kernel<<<static_cast<unsigned>(shard.n_blocks), kThreads, 0, static_cast<cudaStream_t>(stream)>>>(shard);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
