// Stochastic rounding of float32 values to bfloat16 (unbiased: E[SR(x)] = x), used by pure
// bf16 training to keep small updates that round-to-nearest would drop. Element i uses random
// bits hash(seed, offset + i): deterministic for a given seed, and the same whatever the
// sharding when offset is the element's global index.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>

namespace ptrain {

// x: float32 (CPU, or CUDA when built with nvcc). Returns a bfloat16 tensor of x's shape.
at::Tensor stochastic_round_bf16(const at::Tensor& x, uint64_t seed, uint64_t offset);

}  // namespace ptrain
