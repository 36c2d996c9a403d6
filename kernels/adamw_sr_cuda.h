// AdamW on bf16 parameters and moments with stochastic rounding of the parameters, in one
// fused pass on the GPU (float32 math; moments rounded to nearest). The CPU reference is
// AdamW::update_stochastic in src/optim/adamw.cpp (the same update written with ATen ops).
#pragma once
#include <cstdint>

namespace ptrain::kernels {

struct AdamWSrShard {
  uint16_t* param;       // bf16 bits [n]
  const uint16_t* grad;  // bf16 bits [n]
  uint16_t* exp_avg;     // bf16 bits [n]
  uint16_t* exp_avg_sq;  // bf16 bits [n]
  int64_t n;
  int64_t decay_numel;  // elements [0, decay_numel) get weight decay
  // 1 - beta1 and 1 - beta2 computed in double on the host and rounded once, as ATen rounds the
  // reference's scalars (1.0f - 0.9f in float is a different number); decay_factor = 1 - lr * weight_decay
  float beta2, one_minus_beta1, one_minus_beta2, eps, decay_factor;
  float step_size;              // lr / (1 - beta1^t)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^t)
  uint64_t seed;                // this step's SR stream
  uint64_t global_offset;       // SR index of element 0
};

void adamw_bf16_sr_step(const AdamWSrShard& shard, void* stream);  // stream: cudaStream_t

}  // namespace ptrain::kernels
