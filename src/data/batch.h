// One micro-batch as the model takes it: inputs and next-token targets, and for packed rows the
// document each position belongs to.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>

namespace ptrain {

struct Batch {
  at::Tensor inputs;   // [B, T] token ids (int64)
  at::Tensor targets;  // [B, T] the id each position predicts, -100 where nothing is trained
  at::Tensor doc_ids;  // [B, T] document of each position (packed rows), or undefined
  at::Tensor pairs;    // preference rows (PairRows): [B / 2] int64 on the host, the pair of each chosen row
  at::Tensor labels;   // KTO rows (KtoRows): [B / 2] bool on the host, whether each example is desirable
  // The ids the rows hold, padding excluded — what TRL's num_tokens adds up (its attention mask's
  // sum): a sample's every id (its last one too, which no position inputs), a window's T + 1;
  // every pair row's; KTO's example rows', not their KL rows'.
  int64_t num_tokens = 0;
  // Positions whose target is trained (not -100).
  int64_t trained_tokens() const;
  Batch to(const c10::Device& device) const;
  // Inputs [:, :T] and targets [:, 1:] of windows [B, T+1] of a token stream.
  static Batch of_windows(const at::Tensor& windows);
};

}  // namespace ptrain
