#include "model/forward.h"

#include <ATen/ATen.h>

#include <stdexcept>

namespace ptrain {

void llama_forward(WeightSource& source, const LlamaShape& shape, const RopeTables& rope, const at::Tensor& inputs,
                   const HeadFn& head) {
  at::Tensor x = at::embedding(source.embedding(), inputs, shape.padding_idx);
  source.embedding_done();
  for (int64_t layer = 0; layer < shape.n_layers; ++layer) x = source.block(layer, x, rope);
  const HeadWeights w = source.head();
  const at::Tensor h = rms_norm(x, w.norm, shape.norm_eps);
  head(h.reshape({-1, shape.dim}), w.output, source.output_adapter());
  source.head_done();
}

at::Tensor llama_loss(WeightSource& source, const LlamaShape& shape, const RopeTables& rope, const at::Tensor& inputs,
                      const at::Tensor& targets, int64_t loss_chunk, c10::ScalarType logits_dtype, bool fused_loss,
                      at::Tensor* stats) {
  at::Tensor loss;
  llama_forward(
      source, shape, rope, inputs, [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
        loss =
            linear_cross_entropy(h, out, targets.reshape({-1}), loss_chunk, logits_dtype, adapter, fused_loss, stats);
      });
  return loss;
}

at::Tensor llama_token_logprobs(WeightSource& source, const LlamaShape& shape, const RopeTables& rope,
                                const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                                c10::ScalarType logits_dtype, bool fused_loss, at::Tensor* stats) {
  at::Tensor logps;
  llama_forward(
      source, shape, rope, inputs, [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
        logps =
            linear_token_logprobs(h, out, targets.reshape({-1}), loss_chunk, logits_dtype, adapter, fused_loss, stats);
      });
  return logps;
}

LossSum llama_loss_sum(WeightSource& source, const LlamaShape& shape, const RopeTables& rope, const at::Tensor& inputs,
                       const at::Tensor& targets, int64_t loss_chunk, c10::ScalarType logits_dtype, bool fused_loss,
                       bool token_stats) {
  at::NoGradGuard no_grad;
  LossSum sum;
  llama_forward(source, shape, rope, inputs,
                [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
                  sum = linear_cross_entropy_sum(h, out, targets.reshape({-1}), loss_chunk, logits_dtype, adapter,
                                                 fused_loss, token_stats);
                });
  return sum;
}

at::Tensor llama_logits(WeightSource& source, const LlamaShape& shape, const RopeTables& rope,
                        const at::Tensor& inputs) {
  at::NoGradGuard no_grad;
  at::Tensor logits;
  llama_forward(source, shape, rope, inputs,
                [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
                  logits = at::linear(h, out).to(at::kFloat);
                  if (adapter)
                    logits += at::linear(at::linear(h, adapter->a), adapter->b).to(at::kFloat) * adapter->scale;
                });
  return logits;
}

at::Tensor llama_next_logits(WeightSource& source, const LlamaShape& shape, const RopeTables& rope,
                             const at::Tensor& inputs) {
  at::NoGradGuard no_grad;
  at::Tensor logits;
  const int64_t B = inputs.size(0), T = inputs.size(1);
  llama_forward(source, shape, rope, inputs,
                [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
                  const at::Tensor last = h.view({B, T, shape.dim}).select(1, T - 1);
                  logits = at::linear(last, out).to(at::kFloat);
                  if (adapter)
                    logits += at::linear(at::linear(last, adapter->a), adapter->b).to(at::kFloat) * adapter->scale;
                });
  return logits;
}

DenseWeights::DenseWeights(const LlamaShape& shape, c10::ScalarType dtype, const at::Device& device)
    : shape_(shape), layouts_(llama_units(shape, 0.0)) {
  for (const auto& l : layouts_)
    flats_.push_back(at::zeros({l.numel}, at::TensorOptions().dtype(dtype).device(device)));
}

void DenseWeights::load(const std::function<at::Tensor(const std::string& name)>& tensor) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < layouts_.size(); ++i)
    for (const auto& slot : layouts_[i].slots) {
      at::Tensor src = tensor(slot.name);
      if (src.sizes().vec() != slot.shape)
        throw std::invalid_argument("tensor '" + slot.name + "' has shape " + c10::str(src.sizes()) +
                                    ", the model expects " + c10::str(c10::IntArrayRef(slot.shape)));
      slot_view(flats_[i], slot).copy_(src);
    }
}

const RopeTables& DenseWeights::rope(int64_t seq_len) {
  if (!rope_.cos.defined() || rope_.cos.size(0) < seq_len) rope_ = rope_tables(shape_, seq_len, flats_[0].device());
  return rope_;
}

at::Tensor DenseWeights::embedding() { return embedding_weight(flats_.front(), layouts_.front()); }

at::Tensor DenseWeights::block(int64_t layer, const at::Tensor& x, const RopeTables& rope) {
  const size_t unit = block_unit(layer);
  return block_forward(BlockWeights::from_flat(flats_[unit], layouts_[unit]), x, rope, shape_, nullptr,
                       cache_layer(rope, layer));
}

HeadWeights DenseWeights::head() { return HeadWeights::from_flat(flats_.back(), layouts_.back(), embedding(), shape_); }

}  // namespace ptrain
