// The whole Llama forward — embedding, blocks, final norm, output projection + loss — over a
// WeightSource that hands out one piece's weights at a time. The model math does not know
// where weights live: FsdpModel (src/parallel) gathers each unit just in time and frees it
// after, DenseWeights below holds a whole model in memory (tests, tools).
#pragma once
#include <ATen/Tensor.h>

#include <functional>
#include <string>
#include <vector>

#include "model/layout.h"
#include "model/llama.h"
#include "model/loss.h"
#include "model/shape.h"

namespace ptrain {

class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The embedding table [vocab, dim] for the lookup; embedding_done() follows the lookup.
  virtual at::Tensor embedding() = 0;
  virtual void embedding_done() {}
  // Block `layer` applied to x [B, T, dim]: the source supplies its weights (and adapters)
  // and may run it its own way (e.g. recomputed in backward); see run_block.
  virtual at::Tensor block(int64_t layer, const at::Tensor& x, const RopeTables& rope) = 0;
  // The head: final norm and output weights, an output adapter or null; head_done() follows
  // the head's use.
  virtual HeadWeights head() = 0;
  virtual const OutputAdapter* output_adapter() { return nullptr; }
  virtual void head_done() {}
};

// What the head callback receives: the final-normed hidden states [B*T, dim], the output
// weight [vocab, dim] and the output adapter (or null), while the head's weights are held.
using HeadFn = std::function<void(const at::Tensor& hidden, const at::Tensor& output, const OutputAdapter* adapter)>;

// inputs [B, T] token ids -> embedding -> blocks -> final norm -> head(...).
void llama_forward(WeightSource& source, const LlamaShape& shape, const RopeTables& rope, const at::Tensor& inputs,
                   const HeadFn& head);

// Mean cross-entropy over unmasked targets [B, T] (the chunked float32 loss; autograd);
// fused_loss: kernels.fused_loss (model/loss.h); `stats` (when non-null) receives each token's
// TokenStat columns [B*T, TokenStat::count] (no autograd).
at::Tensor llama_loss(WeightSource& source, const LlamaShape& shape, const RopeTables& rope, const at::Tensor& inputs,
                      const at::Tensor& targets, int64_t loss_chunk, c10::ScalarType logits_dtype,
                      bool fused_loss = false, at::Tensor* stats = nullptr);
// Per-token log-probabilities of targets [B, T] as float32 [B*T] (0 where masked), through the
// chunked head (linear_token_logprobs; autograd when grad mode is on); `stats` (when
// non-null) receives each token's TokenStat columns [B*T, TokenStat::count] (no autograd).
at::Tensor llama_token_logprobs(WeightSource& source, const LlamaShape& shape, const RopeTables& rope,
                                const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                                c10::ScalarType logits_dtype, bool fused_loss = false, at::Tensor* stats = nullptr);
// Summed loss and token count, no autograd (with `token_stats`, LossSum's token sums too).
LossSum llama_loss_sum(WeightSource& source, const LlamaShape& shape, const RopeTables& rope, const at::Tensor& inputs,
                       const at::Tensor& targets, int64_t loss_chunk, c10::ScalarType logits_dtype,
                       bool fused_loss = false, bool token_stats = false);
// Logits [B*T, vocab] in float32, no autograd (materialises them all).
at::Tensor llama_logits(WeightSource& source, const LlamaShape& shape, const RopeTables& rope,
                        const at::Tensor& inputs);

// Logits [B, vocab] in float32 of each sequence's last position, no autograd (decoding: with a
// KV cache in `rope`, inputs are the new tokens after the cached ones).
at::Tensor llama_next_logits(WeightSource& source, const LlamaShape& shape, const RopeTables& rope,
                             const at::Tensor& inputs);

// A whole dense model in memory: one flat buffer per unit of llama_units(shape), in one dtype.
class DenseWeights : public WeightSource {
 public:
  DenseWeights(const LlamaShape& shape, c10::ScalarType dtype, const at::Device& device);
  // Copies every tensor from `tensor` (by Hugging Face name), converting its dtype.
  void load(const std::function<at::Tensor(const std::string& name)>& tensor);
  std::vector<at::Tensor>& units() { return flats_; }
  const RopeTables& rope(int64_t seq_len);

  at::Tensor embedding() override;
  at::Tensor block(int64_t layer, const at::Tensor& x, const RopeTables& rope) override;
  HeadWeights head() override;

 private:
  LlamaShape shape_;
  std::vector<UnitLayout> layouts_;
  std::vector<at::Tensor> flats_;
  RopeTables rope_;
};

}  // namespace ptrain
