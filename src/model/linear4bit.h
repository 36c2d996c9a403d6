// Linear layers over a frozen NF4 base weight (QLoRA's base; the adapters are model/llama.h's
// BlockLora).
//
// linear4bit(x, W4) = x @ dequant(W4)^T without ever keeping the dequantized weight: forward
// dequantizes into a temporary, multiplies and drops it; autograd saves only the packed codes
// and scales (already resident); backward dequantizes again for grad_input = grad_out @ W.
// The frozen weight gets no gradient and the input is not saved (only LoRA's A needs it).

#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "quant/nf4.h"

namespace ptrain {

// x [..., in] (float32 or bf16) -> [..., out] in x's dtype; `weight` is [out, in] NF4 and must
// outlive the autograd graph (the model owns it).
at::Tensor linear4bit(const at::Tensor& x, const nf4::Quantized& weight);
// The same over NF4 modules whose rows stack into one weight (a fused q/k/v or gate/up group,
// each module quantized on its own): dequantized one module at a time into the stacked buffer.
at::Tensor linear4bit(const at::Tensor& x, const std::vector<const nf4::Quantized*>& modules);
at::Tensor dequantize_rows(const std::vector<const nf4::Quantized*>& modules, c10::ScalarType dtype);
inline at::Tensor linear4bit(const at::Tensor& x, const std::shared_ptr<const nf4::Quantized>& weight) {
  return linear4bit(x, *weight);
}

}  // namespace ptrain
