// NF4 arithmetic shared by the CPU reference (quant/nf4.cpp) and the CUDA dequantize kernel
// (kernels/nf4_dequant.cu). Header-only, no LibTorch.
#pragma once
#include <cstdint>

#include "common/hash.h"

namespace ptrain::nf4 {

constexpr int64_t kBlock = 64;        // weights per absmax
constexpr int64_t kStatsBlock = 256;  // absmax values per second-level absmax (double quant)

// bitsandbytes' NF4 code, index -> value (bitsandbytes' NF4 table), ascending.
constexpr float kCode[16] = {-1.0f,
                             -0.6961928009986877f,
                             -0.5250730514526367f,
                             -0.39491748809814453f,
                             -0.28444138169288635f,
                             -0.18477343022823334f,
                             -0.09105003625154495f,
                             0.0f,
                             0.07958029955625534f,
                             0.16093020141124725f,
                             0.24611230194568634f,
                             0.33791524171829224f,
                             0.44070982933044434f,
                             0.5626170039176941f,
                             0.7229568362236023f,
                             1.0f};

// Code index of element i of a packed buffer: element 2j in the high nibble of byte j.
PTRAIN_HD int nibble(const uint8_t* packed, int64_t i) {
  return (i & 1) ? (packed[i >> 1] & 0xF) : (packed[i >> 1] >> 4);
}

}  // namespace ptrain::nf4
