// NF4 -> float32/bf16. The 16 codes are copied from constant memory into shared memory per block:
// a warp's lanes read different codes, which constant memory serves one address at a time.
// Aligned buffers whose length is a multiple of 8 take the vector path — a thread turns one
// 32-bit word (8 codes) into one 16-byte bf16 store or two float32 ones —, others one byte per
// thread. Both compute every element as code * scale, the scale rounded as the CPU rounds it.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <mutex>
#include <stdexcept>
#include <string>

#include "cuda_check.h"
#include "nf4_dequant_cuda.h"
#include "quant/nf4_math.h"

namespace ptrain::kernels {

namespace {
__constant__ float kNf4[16];

// The absmax of 64-block b: stored, or with double quantization its 8-bit code's value times
// the 256-block's absmax plus the offset — rounded after the product and after the sum, as the
// CPU's two tensor operations round (nvcc would otherwise fuse them into one FMA).
__device__ __forceinline__ float block_scale(const Nf4Dequant& a, int64_t b) {
  return a.absmax ? a.absmax[b]
                  : __fadd_rn(__fmul_rn(a.code8[a.qabsmax[b]], a.absmax2[b / nf4::kStatsBlock]), a.offset);
}

__device__ __forceinline__ void load_codes(float* table) {
  if (threadIdx.x < 16) table[threadIdx.x] = kNf4[threadIdx.x];
  __syncthreads();
}

// One packed byte (two elements) per thread.
__global__ void nf4_bytes_kernel(Nf4Dequant a) {
  __shared__ float table[16];
  load_codes(table);
  const int64_t pairs = (a.numel + 1) / 2;
  for (int64_t j = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; j < pairs;
       j += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint8_t byte = a.packed[j];
    const float scale = block_scale(a, (2 * j) / nf4::kBlock);  // both elements of a byte share a 64-block
    const float v0 = table[byte >> 4] * scale, v1 = table[byte & 0xF] * scale;
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

// One 32-bit word (eight elements, all in one 64-block) per thread: numel % 8 == 0, `packed`
// 4-byte and `out` 16-byte aligned. Byte k of the word is packed[4g + k] (little-endian), its
// high nibble element 8g + 2k.
__global__ void nf4_words_kernel(Nf4Dequant a) {
  __shared__ float table[16];
  load_codes(table);
  const int64_t words = a.numel / 8;
  for (int64_t g = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; g < words;
       g += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const uint32_t word = reinterpret_cast<const uint32_t*>(a.packed)[g];
    const float scale = block_scale(a, (8 * g) / nf4::kBlock);
    float v[8];
#pragma unroll
    for (int k = 0; k < 4; ++k) {
      const uint32_t byte = (word >> (8 * k)) & 0xFFu;
      v[2 * k] = table[byte >> 4] * scale;
      v[2 * k + 1] = table[byte & 0xFu] * scale;
    }
    if (a.out_bf16) {
      union {
        __nv_bfloat162 pairs[4];
        uint4 bits;
      } o;
#pragma unroll
      for (int k = 0; k < 4; ++k) o.pairs[k] = __floats2bfloat162_rn(v[2 * k], v[2 * k + 1]);  // .x: the lower address
      reinterpret_cast<uint4*>(a.out)[g] = o.bits;
    } else {
      float4* o = reinterpret_cast<float4*>(a.out) + 2 * g;
      o[0] = make_float4(v[0], v[1], v[2], v[3]);
      o[1] = make_float4(v[4], v[5], v[6], v[7]);
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
  const bool words = nf4_takes_words(args);
  const int64_t items = words ? args.numel / 8 : (args.numel + 1) / 2;
  const auto blocks = static_cast<unsigned>(std::min<int64_t>((items + threads - 1) / threads, 65535LL * 8));
  if (words)
    nf4_words_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  else
    nf4_bytes_kernel<<<blocks, threads, 0, static_cast<cudaStream_t>(stream)>>>(args);
  PTRAIN_CUDA_CHECK(cudaGetLastError());
}

}  // namespace ptrain::kernels
