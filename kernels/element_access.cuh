// Element loads and stores of the elementwise kernels: float32 or bfloat16 in memory, float32 in
// registers (a bfloat16 store rounds to nearest even).
#pragma once
#include <cuda_bf16.h>

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

}  // namespace ptrain::kernels
