// Blockwise 8-bit quantization with bitsandbytes' dynamic maps: the building block of
// AdamW8bit's optimizer state. Bit-identical to bitsandbytes 0.50.2's reference backend
// (tests/fixtures/make_fixtures.py saves its outputs; tests/unit/test_adamw8bit.cpp compares).
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <utility>

namespace ptrain::q8 {

// bitsandbytes' create_dynamic_map(signed): 256 ascending float32 codes in [-1, 1] (signed,
// for the first moment) or [0, 1] (unsigned, for the second), denser near zero.
at::Tensor dynamic_map(bool is_signed);
// The 255 float32 midpoints between consecutive codes (the quantization thresholds).
at::Tensor midpoints(const at::Tensor& code);

// x: float32 CPU tensor, quantized in blocks of `block` consecutive elements of its flattened
// form (the last block may be shorter). Returns (uint8 codes of x's shape, float32 absmax
// per block).
std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& x, const at::Tensor& code, int64_t block);
at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& code,
                                int64_t block);

}  // namespace ptrain::q8
