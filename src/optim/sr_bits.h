// The stochastic-rounding arithmetic shared by the CPU reference and the CUDA kernel, so the
// two produce identical bits. Header-only, no LibTorch.
#pragma once
#include <cstdint>

#include "common/hash.h"

namespace ptrain::sr {

// splitmix64 finaliser of (seed, index): a counter-based generator, so element i's random
// bits depend only on (seed, i) — not on threads, ranks or how the tensor is split.
PTRAIN_HD uint64_t hash(uint64_t seed, uint64_t index) { return mix64(seed ^ (index * kGolden64)); }

// float32 bits -> bfloat16 bits, rounding up with probability (dropped 16 bits) / 2^16, so
// E[result] = x. NaN/Inf pass through unchanged (NaN kept quiet).
PTRAIN_HD uint16_t round_bits(uint32_t bits, uint64_t random) {
  if ((bits & 0x7F800000u) == 0x7F800000u) return static_cast<uint16_t>((bits >> 16) | ((bits & 0xFFFFu) ? 0x40u : 0u));
  const uint32_t r = static_cast<uint32_t>(random & 0xFFFFu);
  return static_cast<uint16_t>((bits + r) >> 16);
}

// The random stream of one optimizer step: every step rounds with fresh, reproducible bits.
PTRAIN_HD uint64_t step_seed(uint64_t seed, int64_t step) {
  return seed ^ (0xA24BAED4963EE407ull * static_cast<uint64_t>(step));
}

}  // namespace ptrain::sr
