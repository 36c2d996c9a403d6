// Linear layers over a frozen NF4 base weight, with optional LoRA adapters (QLoRA).
//
// linear4bit(x, W4) = x @ dequant(W4)^T without ever keeping the dequantized weight: forward
// dequantizes into a temporary, multiplies and drops it; autograd saves only the packed codes
// and scales (already resident); backward dequantizes again for grad_input = grad_out @ W.
// The frozen weight gets no gradient and the input is not saved (only LoRA's A needs it).
//
// lora(x, A, B) = dropout(x) @ A^T @ B^T * (alpha / rank): A [rank, in], B [out, rank]; A is
// initialised Kaiming-uniform (bound 1/sqrt(in), as PEFT), B zeros, so at step 0 the adapted
// layer equals the base layer.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>

#include "quant/nf4.h"

namespace ptrain {

// x [..., in] (float32 or bf16) -> [..., out] in x's dtype; `weight` is [out, in] NF4 and must
// outlive the autograd graph (the model owns it).
at::Tensor linear4bit(const at::Tensor& x, const nf4::Quantized& weight);
inline at::Tensor linear4bit(const at::Tensor& x, const std::shared_ptr<const nf4::Quantized>& weight) {
  return linear4bit(x, *weight);
}

struct LoraOptions {
  int64_t rank = 16;
  double alpha = 32.0;
  double dropout = 0.0;
  double scale() const { return alpha / static_cast<double>(rank); }
};

// The adapter's contribution; A and B are trainable leaves (or views of a flat buffer).
at::Tensor lora_delta(const at::Tensor& x, const at::Tensor& a, const at::Tensor& b, const LoraOptions& options,
                      bool training);

// A: Kaiming-uniform with a = sqrt(5) (PEFT's init), i.e. U(-1/sqrt(in), 1/sqrt(in)); B: zeros.
void init_lora(at::Tensor a, at::Tensor b, at::Generator& gen);

}  // namespace ptrain
