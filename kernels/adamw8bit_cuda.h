// AdamW8bit on the GPU: one fused pass over a shard — dequantize both moments, update in
// float32, new absmax per 256-element block, requantize, write the parameter (rounded to
// nearest or stochastically when it is bf16). The CPU reference is src/optim/adamw8bit.cpp;
// both use the arithmetic in src/quant/blockwise8_math.h.
#pragma once
#include <cstdint>

#include "quant/blockwise8_math.h"

namespace ptrain::kernels {

struct AdamW8bitShard {
  void* param;  // float32 or bf16 [n_blocks * 256]
  bool param_bf16;
  const void* grad;  // same dtype as param
  uint8_t* m_codes;  // [n_blocks * 256]
  uint8_t* v_codes;
  float* m_absmax;  // [n_blocks]
  float* v_absmax;
  float* m_fp32;  // [fp32 blocks * 256]: moments of blocks kept in float32
  float* v_fp32;
  const int32_t* slot;  // [n_blocks]: -1 = 8-bit block, else its index among the fp32 blocks
  int64_t n_blocks;
  int64_t decay_blocks;  // blocks [0, decay_blocks) get weight decay
  const float* tables;   // device: signed code[256], unsigned code[256], signed mids[255], unsigned mids[255]
  q8::AdamScalars scalars;
  bool stochastic_rounding;
  uint64_t seed;           // this step's SR stream
  uint64_t global_offset;  // SR index of element 0
};

void adamw8bit_step(const AdamW8bitShard& shard, void* stream);  // stream: cudaStream_t

}  // namespace ptrain::kernels
