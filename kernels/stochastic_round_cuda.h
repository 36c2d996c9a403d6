// Stochastic rounding float32 -> bfloat16 on the GPU; the CPU reference is
// src/optim/stochastic_round.cpp and both compute the same bits (tests/unit/test_sr.cpp).
#pragma once
#include <cstdint>

namespace ptrain::kernels {

// out[i] = SR(in[i]) using random bits hash(seed, offset + i). `stream` is a cudaStream_t.
void stochastic_round_bf16(const float* in, uint16_t* out, int64_t n, uint64_t seed, uint64_t offset, void* stream);

}  // namespace ptrain::kernels
