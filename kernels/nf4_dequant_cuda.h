// NF4 dequantization on the GPU: one pass, one thread per output pair (one packed byte),
// code table in registers, absmax (or its double quantization) read per 64-block. The CPU
// reference is ptrain::nf4::dequantize in src/quant/nf4.cpp.
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

}  // namespace ptrain::kernels
