// The arithmetic of bitsandbytes-style blockwise 8-bit quantization and of one 8-bit AdamW
// element update, shared by the CPU reference (quant/blockwise8.cpp, optim/adamw8bit.cpp)
// and the CUDA kernel (kernels/adamw8bit.cu) so both produce the same bits. Header-only, no
// LibTorch.
//
// Quantization semantics are those of bitsandbytes' reference PyTorch backend (and its CUDA
// kernel): scale a block by the reciprocal of its absmax (clamped to 1e-38), clamp to [-1, 1],
// and pick the code whose interval between float32 midpoints holds the value, a value equal
// to a midpoint taking the lower code.
#pragma once
#include <cmath>
#include <cstdint>

#include "common/hash.h"

namespace ptrain::q8 {

constexpr int kCodes = 256;
constexpr int64_t kBlock = 256;       // elements per absmax block (8-bit optimizer state)
constexpr float kMinAbsmax = 1e-38f;  // an all-zero block scales by 1/1e-38 (values stay 0)

// Index of the code for x given the codes-1 ascending midpoints between ascending codes: the
// number of midpoints strictly below x (NaN counts as above every midpoint). 8-bit maps have
// 256 codes, NF4 16.
PTRAIN_HD int nearest_code(const float* midpoints, float x, int codes = kCodes) {
  int lo = 0, hi = codes - 1;  // answer in [lo, hi]
  while (lo < hi) {
    const int mid = (lo + hi) >> 1;
    if (midpoints[mid] < x)
      lo = mid + 1;
    else
      hi = mid;
  }
  return lo;
}

// nearest_code for a short code book (NF4's 16), without branches: the number of midpoints
// below x is the first index whose midpoint is not below it — the binary search's answer, NaN
// included (0) — and the loop vectorises where the search's branches mispredict.
PTRAIN_HD int nearest_code_counted(const float* midpoints, float x, int codes) {
  int k = 0;
  for (int m = 0; m < codes - 1; ++m) k += midpoints[m] < x ? 1 : 0;
  return k;
}

PTRAIN_HD float clamp_unit(float x) { return x < -1.0f ? -1.0f : (x > 1.0f ? 1.0f : x); }

PTRAIN_HD float inverse_scale(float absmax) { return 1.0f / (absmax > kMinAbsmax ? absmax : kMinAbsmax); }

// bitsandbytes' scaling of one block of n values (8-bit and NF4 alike): full blocks (n ==
// block) multiply by the reciprocal of max(absmax, 1e-38), a short last block divides by it
// and reports that clamped absmax.
struct BlockScale {
  float absmax;  // as stored
  float clamped, inv;
  bool full;
  PTRAIN_HD float operator()(float x) const { return clamp_unit(full ? x * inv : x / clamped); }
};

PTRAIN_HD BlockScale block_scale(const float* x, int64_t n, int64_t block) {
  float amax = 0.0f;
  for (int64_t i = 0; i < n; ++i) amax = fmaxf(amax, fabsf(x[i]));
  const float clamped = amax > kMinAbsmax ? amax : kMinAbsmax;
  const bool full = n == block;
  return {full ? amax : clamped, clamped, 1.0f / clamped, full};
}

// One element of AdamW (torch order: decoupled decay, then the Adam step) in float32 from
// dequantized moments. A non-finite gradient zeroes the element's moments and leaves its
// parameter untouched (bitsandbytes' rule), so one bad value cannot poison a whole block.
struct AdamScalars {
  float beta1, beta2, eps, lr, decay_factor;  // decay_factor = 1 - lr * weight_decay (1 if none)
  float step_size;                            // lr / (1 - beta1^t)
  float bias_correction2_sqrt;                // sqrt(1 - beta2^t)
};

PTRAIN_HD bool finite(float x) {
#if defined(__CUDA_ARCH__)
  return isfinite(x);
#else
  return std::isfinite(x);
#endif
}

PTRAIN_HD float square_root(float x) {
#if defined(__CUDA_ARCH__)
  return sqrtf(x);
#else
  return std::sqrt(x);
#endif
}

PTRAIN_HD void adam_element(const AdamScalars& s, bool decay, float g, float& p, float& m, float& v) {
  if (!finite(g)) {
    m = 0.0f;
    v = 0.0f;
    return;
  }
  m = m * s.beta1 + (1.0f - s.beta1) * g;
  v = v * s.beta2 + (1.0f - s.beta2) * g * g;
  if (decay) p *= s.decay_factor;
  p -= s.step_size * (m / (square_root(v) / s.bias_correction2_sqrt + s.eps));
}

}  // namespace ptrain::q8
