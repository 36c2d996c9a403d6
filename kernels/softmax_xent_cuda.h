// The loss head's softmax cross-entropy over one chunk of logits on the GPU, loss and gradient in
// one kernel (llm.c's fused classifier); the CPU reference is the composite path in
// src/model/loss.cpp (tests/unit/test_kernels.cpp compares the two).
#pragma once
#include <cstdint>

namespace ptrain::kernels {

// logits: contiguous [rows, vocab], float32 or bfloat16 (logits_bf16); targets: [rows] int64, a
// negative target (-100) masks its row. grad: contiguous [rows, vocab], float32 or bfloat16
// (grad_bf16), or null for the loss alone; it may be the logits buffer itself when the two dtypes
// are one (each element is read before the same thread writes it). row_loss: [rows] float32.
struct XentShape {
  int64_t rows = 0, vocab = 0;
  bool logits_bf16 = false, grad_bf16 = false;
  float scale = 1.0f;  // the gradient's factor (1 / unmasked tokens for the mean)
};
// Per row: lse = log(sum_j exp(logit_j)) in float32 (one online max-and-sum pass); row_loss =
// lse - logit[target] (0 when masked); grad_j = (exp(logit_j - lse) - [j == target]) * scale
// (0 when masked), rounded once to the grad's dtype. `stream` is a cudaStream_t.
void softmax_xent(const XentShape& s, const void* logits, const int64_t* targets, float* row_loss, void* grad,
                  void* stream);

}  // namespace ptrain::kernels
