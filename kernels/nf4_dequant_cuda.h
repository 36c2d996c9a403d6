// NF4 dequantization on the GPU: one pass, the code table in shared memory, absmax (or its
// double quantization) read per 64-block; eight elements per thread (one 32-bit word in, 16-byte
// stores out) where the buffers allow, one packed byte per thread elsewhere. The CPU reference is
// ptrain::nf4::dequantize in src/quant/nf4.cpp.
#pragma once
#include <cstdint>

namespace ptrain::kernels {

struct Nf4Dequant {
  const uint8_t* packed;   // [ceil(numel / 2)]
  const float* absmax;     // [blocks] float32, or null with double quantization
  const uint8_t* qabsmax;  // [blocks] 8-bit codes (double quantization)
  const float* absmax2;    // [ceil(blocks / 256)] (double quantization)
  const float* code8;      // device: the signed dynamic map, 256 values (double quantization)
  float offset;            // mean absmax (double quantization)
  int64_t numel;
  void* out;  // float32 or bf16 [numel]
  bool out_bf16;
};

void nf4_dequantize(const Nf4Dequant& args, void* stream);  // stream: cudaStream_t

// Whether nf4_dequantize takes eight elements per thread: a multiple of 8 elements, `packed`
// 4-byte aligned, `out` 16-byte aligned (the tests reach both paths through it).
inline bool nf4_takes_words(const Nf4Dequant& a) {
  return a.numel % 8 == 0 && reinterpret_cast<uintptr_t>(a.packed) % 4 == 0 &&
         reinterpret_cast<uintptr_t>(a.out) % 16 == 0;
}

}  // namespace ptrain::kernels
