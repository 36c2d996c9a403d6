// Cross-entropy over the output projection, computed one chunk of tokens at a
// time so no [tokens x vocab] float32 tensor ever exists (only [chunk x vocab]). Gradients
// for hidden and weight are produced chunk by chunk in the forward pass and scaled by the
// incoming gradient in backward, so backward needs no recompute.
#pragma once
#include <ATen/Tensor.h>
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <optional>

namespace ptrain {

constexpr int64_t kIgnoreIndex = -100;

// A LoRA adapter on the output projection: logits = h W^T + scale (h A^T) B^T with A [rank,
// dim], B [vocab, rank] (the merged W + scale B A is never formed).
struct OutputAdapter {
  at::Tensor a, b;
  double scale = 1.0;
};

// hidden [N, dim] and weight [vocab, dim] in the compute dtype; targets [N] int64 with
// kIgnoreIndex for masked positions. Returns the mean loss over unmasked tokens (float32
// scalar; 0 when every token is masked). chunk_tokens <= 0 picks a chunk of ~512 MiB of float32
// logits (default_loss_chunk).
// Logits are accumulated in float32 and held in `logits_dtype` (float32 unless the user opted
// into bfloat16 logits); the loss is summed in float32 either way.
// `fused` (kernels.fused_loss): each chunk's softmax, loss and gradient by softmax_xent's fused
// form (below). `stats` (when non-null) receives each token's TokenStat columns [N,
// TokenStat::count] float32 without autograd, as linear_token_logprobs gives them (masked rows
// included; callers mask them): one more pass over each chunk's logits.
at::Tensor linear_cross_entropy(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                int64_t chunk_tokens = 0, c10::ScalarType logits_dtype = c10::kFloat,
                                const OutputAdapter* adapter = nullptr, bool fused = false,
                                at::Tensor* stats = nullptr);

// Per-token log-probabilities of `targets` [N] under the same head: float32 [N], 0 at masked
// positions, differentiable w.r.t. hidden, weight and an adapter's A and B — what preference
// objectives (DPO, SimPO) sum per sequence. Where linear_cross_entropy's incoming gradient is one
// number, known in forward, each token's here arrives in backward: backward recomputes each
// chunk's logits (one more pass of the output projection) rather than keeping them.
// `stats` (when non-null) receives per-token statistics of the head's distribution, without
// autograd, as TRL's fused head returns them: [N, TokenStat::count] float32, columns below (the
// targets' rows at masked positions hold the unmasked formulas' values; callers mask them). They
// are computed from the same logits, 16 rows at a time (token_stats_bytes beside the chunk).
struct TokenStat {
  static constexpr int64_t entropy = 0;     // -sum_v p_v log p_v (nats)
  static constexpr int64_t log_sum_sq = 1;  // log sum_v p_v^2 (WPO's weights)
  static constexpr int64_t mean_logit = 2;  // sum_v z_v / vocab
  static constexpr int64_t is_top1 = 3;     // 1 where the target is the first largest logit, else 0
  static constexpr int64_t count = 4;
};
at::Tensor linear_token_logprobs(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_tokens = 0, c10::ScalarType logits_dtype = c10::kFloat,
                                 const OutputAdapter* adapter = nullptr, bool fused = false,
                                 at::Tensor* stats = nullptr);
// The entropy and top-1 hits of `stats` [N, TokenStat::count] summed over the rows whose target
// (`targets`, N of them in any shape) is not kIgnoreIndex: float64 [2] on stats' device.
at::Tensor trained_token_stats(const at::Tensor& stats, const at::Tensor& targets);

// Summed loss and number of unmasked tokens, without autograd (evaluation); with `token_stats`,
// also the unmasked tokens' TokenStat entropy and top-1 hits summed (one more pass over each
// chunk's logits, as linear_cross_entropy's `stats`).
struct LossSum {
  double sum = 0.0;
  int64_t tokens = 0;
  double entropy_sum = 0.0, top1 = 0.0;
};
LossSum linear_cross_entropy_sum(const at::Tensor& hidden, const at::Tensor& weight, const at::Tensor& targets,
                                 int64_t chunk_tokens = 0, c10::ScalarType logits_dtype = c10::kFloat,
                                 const OutputAdapter* adapter = nullptr, bool fused = false, bool token_stats = false);

// One chunk's softmax cross-entropy: logits [n, vocab] (float32, or bfloat16 when the user opted
// into bf16 logits), targets [n] with kIgnoreIndex for masked rows. Returns the summed loss of the
// unmasked rows (float32 scalar) and, when grad_dtype is given, d(loss sum)/d(logits) * scale in
// grad_dtype. Consumes `logits`: its values are undefined afterwards (the gradient may be
// computed in its place).
//   composite (softmax_xent_reference) — LibTorch's logsumexp, gather, in-place exp, scatter,
//     scaling and cast, one pass over the chunk each;
//   fused — on a CUDA chunk one kernel (kernels/softmax_xent.cu) reading it twice; elsewhere the
//     composite path (the kernel's CPU reference).
struct XentChunk {
  at::Tensor loss_sum;  // float32 scalar
  at::Tensor grad;      // [n, vocab] in grad_dtype, or undefined
  at::Tensor row_loss;  // [n] float32: each row's loss, 0 where masked
};
XentChunk softmax_xent(at::Tensor logits, const at::Tensor& targets, double scale,
                       std::optional<c10::ScalarType> grad_dtype, bool fused);
XentChunk softmax_xent_reference(at::Tensor logits, const at::Tensor& targets, double scale,
                                 std::optional<c10::ScalarType> grad_dtype);

int64_t default_loss_chunk(int64_t vocab_size);

// Bytes per logit one loss chunk holds at its fullest, for the memory plan, from element sizes:
// the logits (`logits`), the gradient w.r.t. them (`grad`: float32 with an output adapter, else
// the compute dtype), its copy in the compute dtype (`compute`). An output adapter's product is
// summed into float32 logits in place (then rounded to `logits`); the composite path's
// log-sum-exp holds one temporary of the logits' size (measured: ChunkedLoss tests); the fused kernel writes the
// gradient into the logits' buffer when the dtypes agree.
int64_t loss_chunk_bytes_per_logit(int64_t logits, int64_t grad, int64_t compute, bool adapter, bool fused);
// Bytes linear_token_logprobs' `stats` holds beside a chunk's logits (`logits_bytes` an element),
// for the memory plan: float32 temporaries of 16 rows of the vocabulary.
int64_t token_stats_bytes(int64_t vocab, int64_t logits_bytes);

}  // namespace ptrain
