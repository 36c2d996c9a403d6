// Stochastic rounding float32 -> bfloat16: one thread per element, counter-based random bits.
#include <cuda_runtime.h>

#include <cstring>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "optim/sr_bits.h"
#include "stochastic_round_cuda.h"

namespace ptrain::kernels {

namespace {
__global__ void stochastic_round_kernel(const float* __restrict__ in, uint16_t* __restrict__ out, int64_t n,
                                        uint64_t seed, uint64_t offset) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t bits = __float_as_uint(in[i]);
    out[i] = sr::round_bits(bits, sr::hash(seed, offset + static_cast<uint64_t>(i)));
  }
}
}  // namespace

void stochastic_round_bf16(const float* in, uint16_t* out, int64_t n, uint64_t seed, uint64_t offset, void* stream) {
  if (n == 0) return;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((n + threads - 1) / threads, 65535LL * 8);
  stochastic_round_kernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(
      in, out, n, seed, offset);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
