// splitmix64's finaliser: the one bit mixer behind ptrain's counter-based randomness (per-unit
// init seeds, the data order, stochastic-rounding bits). Header-only, usable from CUDA.
#pragma once
#include <cstdint>

#if defined(__CUDACC__)
#define PTRAIN_HD __host__ __device__ __forceinline__
#else
#define PTRAIN_HD inline
#endif

namespace ptrain {

constexpr uint64_t kGolden64 = 0x9E3779B97F4A7C15ull;  // 2^64 / golden ratio

PTRAIN_HD uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

}  // namespace ptrain
