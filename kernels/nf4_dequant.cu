// NF4 -> float32/bf16; the 16 codes live in constant memory.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "nf4_dequant_cuda.h"
#include "quant/nf4_math.h"

namespace ptrain::kernels {

namespace {
__constant__ float kNf4[16];

__global__ void nf4_kernel(Nf4Dequant a) {
  const int64_t pairs = (a.numel + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t byte = a.packed[j];
    const int64_t b = (2 * j) / nf4::kBlock;  // both elements of a byte share a 64-block
    // Rounded after the product and after the sum, as the CPU's two tensor operations round:
    // nvcc would otherwise fuse them into one FMA and differ in the last bit.
    const float scale =
        a.absmax ? a.absmax[b] : __fadd_rn(__fmul_rn(a.code8[a.qabsmax[b]], a.absmax2[b / nf4::kStatsBlock]), a.offset);
    const float v0 = kNf4[byte >> 4] * scale, v1 = kNf4[byte & 0xF] * scale;
    const int64_t i = 2 * j;
    if (a.out_bf16) {
      auto* o = static_cast<__nv_bfloat16*>(a.out);
      o[i] = __float2bfloat16_rn(v0);
      if (i + 1 < a.numel) o[i + 1] = __float2bfloat16_rn(v1);
    } else {
      auto* o = static_cast<float*>(a.out);
      o[i] = v0;
      if (i + 1 < a.numel) o[i + 1] = v1;
    }
  }
}

}  // namespace

void nf4_dequantize(const Nf4Dequant& args, void* stream) {
  static std::once_flag once;
  std::call_once(once, [] { PTRAIN_CUDA_CHECK(cudaMemcpyToSymbol(kNf4, nf4::kCode, sizeof nf4::kCode)); });
  if (args.numel == 0) return;
  if (!args.absmax && !args.code8)
    throw std::runtime_error("nf4_dequantize: double-quantized input needs the 8-bit code");
  const int threads = 256;
  const int64_t pairs = (args.numel + 1) / 2;
  const int64_t blocks = std::min<int64_t>((pairs + threads - 1) / threads, 65535LL * 8);
  nf4_kernel<<<static_cast<unsigned>(blocks), threads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
