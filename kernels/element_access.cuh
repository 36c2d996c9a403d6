// The elementwise kernels' element loads and stores — float32 or bfloat16 in memory, float32 in
// registers (a bfloat16 store rounds to nearest even) — and their grid size.
#pragma once
#include <cuda_bf16.h>

#include <algorithm>
#include <cstdint>

namespace ptrain::kernels {

template <class T>
__device__ float load(const T* p, int64_t i);
template <>
__device__ inline float load<float>(const float* p, int64_t i) {
  return p[i];
}
template <>
__device__ inline float load<__nv_bfloat16>(const __nv_bfloat16* p, int64_t i) {
  return __bfloat162float(p[i]);
}
__device__ inline void store(float* p, int64_t i, float v) { p[i] = v; }
__device__ inline void store(__nv_bfloat16* p, int64_t i, float v) { p[i] = __float2bfloat16_rn(v); }

// Blocks for a grid-stride loop over n elements: enough to cover them, at most 8 per 65535 (the
// loop takes the rest).
inline unsigned grid_for(int64_t n, int threads) {
  return static_cast<unsigned>(std::min<int64_t>((n + threads - 1) / threads, 65535LL * 8));
}

}  // namespace ptrain::kernels
