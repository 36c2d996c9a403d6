#include "parallel/fsdp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef PTRAIN_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <mutex>
#include <optional>

#include "common/error.h"
#include "common/saved_ref.h"

// The autograd glue and the forward schedule of FsdpModel: GatherUnit (gather in forward,
// reduce-scatter in backward), the backward hooks on block activations, activation-checkpointed
// blocks, and the model's WeightSource methods.

namespace ptrain {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

FsdpModel* model_of(AutogradContext* ctx) { return saved_ref_of<FsdpModel>(ctx->saved_data["model"]); }

// Identity on a block's activation whose backward acts on the block's gathered weights:
// on the block's output, `regather` puts freed weights back before any of the block's own
// backward ops run; on a frozen (LoRA) block's input, `release` frees them once the block's
// backward is done (a frozen unit gets no reduce-scatter that would).
enum class UnitAction : int64_t { regather, release };

// The generator dropout draws from on `device`.
at::Generator default_generator(const at::Device& device) {
#ifdef PTRAIN_CUDA
  if (device.is_cuda()) return at::cuda::detail::getDefaultCUDAGenerator(device.index());
#endif
  return at::detail::getDefaultCPUGenerator();
}

// Swaps a generator's state in for its lifetime: a recomputed block draws the dropout masks
// its forward drew, and the stream then continues as if no recompute had happened.
class RngStateScope {
 public:
  RngStateScope(at::Generator gen, const at::Tensor& state) : gen_(std::move(gen)) {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    saved_ = gen_.get_state();
    gen_.set_state(state);
  }
  ~RngStateScope() {
    std::lock_guard<std::mutex> lock(gen_.mutex());
    gen_.set_state(saved_);
  }
  RngStateScope(const RngStateScope&) = delete;
  RngStateScope& operator=(const RngStateScope&) = delete;

 private:
  at::Generator gen_;
  at::Tensor saved_;
};

}  // namespace

// Shard -> gathered unit in the compute dtype; backward reduce-scatters the unit's gradient.
class FsdpModel::GatherUnit : public torch::autograd::Function<FsdpModel::GatherUnit> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& shard, FsdpModel* model, UnitKey key);
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

class FsdpModel::OnBackward : public torch::autograd::Function<FsdpModel::OnBackward> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, FsdpModel* model, int64_t piece,
                            UnitAction action) {
    ctx->saved_data["model"] = saved_ref(model);
    ctx->saved_data["piece"] = piece;
    ctx->saved_data["action"] = static_cast<int64_t>(action);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto piece = static_cast<size_t>(ctx->saved_data["piece"].toInt());
    if (static_cast<UnitAction>(ctx->saved_data["action"].toInt()) == UnitAction::regather)
      model_of(ctx)->regather(piece);
    else
      model_of(ctx)->release_frozen(piece);
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor FsdpModel::GatherUnit::forward(AutogradContext* ctx, const at::Tensor& shard, FsdpModel* model,
                                          UnitKey key) {
  ctx->saved_data["model"] = saved_ref(model);
  ctx->saved_data["role"] = static_cast<int64_t>(key.role);
  ctx->saved_data["piece"] = static_cast<int64_t>(key.piece);
  return model->fill(key);
}

variable_list FsdpModel::GatherUnit::backward(AutogradContext* ctx, variable_list grads) {
  const UnitKey key{static_cast<UnitRole>(ctx->saved_data["role"].toInt()),
                    static_cast<size_t>(ctx->saved_data["piece"].toInt())};
  return {model_of(ctx)->reduce_grad(key, grads[0]), at::Tensor(), at::Tensor()};
}

// A whole block under full activation checkpointing: forward gathers, computes without a
// graph and frees the weights, keeping only the block's input; backward re-gathers,
// recomputes with a graph, differentiates w.r.t. the input and the trained weights — the block's
// own, or with LoRA its adapters over the frozen (dense or NF4) base — and reduce-scatters them.
class FsdpModel::CheckpointedBlock : public torch::autograd::Function<FsdpModel::CheckpointedBlock> {
 public:
  // `trained` is what autograd differentiates besides x: the block's shard, or its adapter shard.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& trained, FsdpModel* model,
                            int64_t piece) {
    ctx->saved_data["model"] = saved_ref(model);
    ctx->saved_data["piece"] = piece;
    if (ActivationOffloader* offloader = model->offloader())
      ctx->saved_data["ticket"] = offloader->offload(x);
    else
      ctx->save_for_backward({x});
    if (model->lora().dropout > 0) {  // the recompute must draw the same masks
      at::Generator gen = default_generator(model->device());
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    model->fill_block(piece);
    model->prefetch_block(piece + 1);
    at::Tensor y = model->compute_block(piece, x);
    model->release_block(piece);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    FsdpModel* model = model_of(ctx);
    const auto piece = static_cast<size_t>(ctx->saved_data["piece"].toInt());
    const bool trains = ctx->needs_input_grad(1);  // false: a frozen block without adapters
    at::Tensor saved;
    if (ctx->saved_data.count("ticket")) {
      const int64_t ticket = ctx->saved_data["ticket"].toInt();
      saved = model->offloader()->fetch(ticket);
      if (ticket > 0) model->offloader()->prefetch(ticket - 1);  // the previous block's input comes back meanwhile
    } else {
      saved = ctx->get_saved_variables()[0];
    }
    at::Tensor x = saved.detach().requires_grad_(true);
    at::Tensor w = model->fill_block(piece).detach().requires_grad_(trains);
    if (piece > kFirstBlockUnit) model->prefetch_block(piece - 1);  // the previous block's backward comes next
    at::Tensor y;
    {
      std::optional<RngStateScope> rng;
      if (ctx->saved_data.count("rng"))
        rng.emplace(default_generator(model->device()), ctx->saved_data["rng"].toTensor());
      at::AutoGradMode grad_on(true);
      y = model->compute_block(piece, x, trains ? w : at::Tensor());
    }
    if (!trains) {
      at::Tensor gx = torch::autograd::grad({y}, {x}, {grads[0]})[0];
      model->release_block(piece);
      return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    auto g = torch::autograd::grad({y}, {x, w}, {grads[0]});
    return {g[0], model->reduce_block_grad(piece, g[1]), at::Tensor(), at::Tensor()};
  }
};

at::Tensor FsdpModel::gather(UnitKey key) {
  if (!unit(key).shard.requires_grad()) return fill(key);  // frozen: nothing to differentiate
  return GatherUnit::apply(unit(key).shard, this, key);
}

BlockWeights FsdpModel::block_weights(size_t piece, const at::Tensor& flat) const {
  const UnitLayout& layout = unit({UnitRole::base, piece}).layout;
  return quant().nf4() ? BlockWeights::from_nf4(flat, layout, nf4_weights(piece))
                       : BlockWeights::from_flat(flat, layout);
}

BlockLora FsdpModel::block_lora(size_t piece, const at::Tensor& flat, bool training) const {
  return BlockLora::from_flat(flat, unit({UnitRole::adapter, piece}).layout, shape(), lora_scale(lora()),
                              lora().dropout, training);
}

at::Tensor FsdpModel::compute_block(size_t piece, const at::Tensor& x, const at::Tensor& trained) {
  const UnitKey adapter{UnitRole::adapter, piece};
  const bool with_lora = has(adapter);
  const at::Tensor w = !with_lora && trained.defined() ? trained : gathered_view({UnitRole::base, piece});
  BlockLora l;
  if (with_lora) l = block_lora(piece, trained.defined() ? trained : gathered_view(adapter), true);
  return block_forward(block_weights(piece, w), x, batch_rope_, shape(), with_lora ? &l : nullptr, nullptr,
                       options_.kernels);
}

const RopeTables& FsdpModel::rope(int64_t seq_len) {
  if (seq_len > rope_len_) {
    rope_ = rope_tables(shape(), std::max(seq_len, std::min<int64_t>(shape().max_seq_len, 2 * seq_len)), device_);
    rope_len_ = rope_.cos.size(0);
  }
  return rope_;
}

// The forward schedule, as the model's WeightSource: each unit is gathered just before its
// piece runs (the next one prefetched meanwhile) and released after it; blocks get backward
// hooks that re-gather them (and, under LoRA, release the frozen base afterwards).
at::Tensor FsdpModel::embedding() {
  training_ = at::GradMode::is_enabled();
  if (training_ && offloader_) offloader_->begin_forward();
  const UnitKey key{UnitRole::base, kEmbeddingUnit};
  at::Tensor embed = gather(key);
  prefetch_block(kFirstBlockUnit);
  wte_ = embedding_weight(embed, unit(key).layout);
  return wte_;
}

void FsdpModel::embedding_done() {
  // the embedding's backward needs no weights
  if (!shape().tie_embeddings) release({UnitRole::base, kEmbeddingUnit});
}

at::Tensor FsdpModel::block(int64_t layer, const at::Tensor& input, const RopeTables& rope) {
  const size_t i = block_unit(layer);
  const UnitKey base{UnitRole::base, i}, adapter{UnitRole::adapter, i};
  if (!adapters_enabled_ && at::GradMode::is_enabled())
    throw RuntimeError("a forward with the adapters off builds no graph (the reference of DPO): run it without grad");
  if (training_ && options_.memory.checkpointing())
    return CheckpointedBlock::apply(input, unit(has(adapter) ? adapter : base).shard, this, static_cast<int64_t>(i));
  at::Tensor x = input;
  at::Tensor w = gather(base);
  at::Tensor a = has(adapter) && adapters_enabled_ ? gather(adapter) : at::Tensor();
  fill_nf4(i);
  prefetch_block(i + 1);  // gathers while this block computes
  BlockLora l;
  if (a.defined()) l = block_lora(i, a, training_);
  // A frozen block gets no reduce-scatter to release it: release once its backward is done.
  if (lora().enabled && training_ && x.requires_grad())
    x = OnBackward::apply(x, this, static_cast<int64_t>(i), UnitAction::release);
  x = block_forward(block_weights(i, w), x, rope, shape(), a.defined() ? &l : nullptr, cache_layer(rope, layer),
                    options_.kernels);
  if (!training_ || options_.parallel.reshard_after_forward) {
    release_block(i);
    if (training_) x = OnBackward::apply(x, this, static_cast<int64_t>(i), UnitAction::regather);
  }
  return x;
}

HeadWeights FsdpModel::head() {
  const UnitKey base = head_unit(UnitRole::base), adapter = head_unit(UnitRole::adapter);
  HeadWeights head = HeadWeights::from_flat(gather(base), unit(base).layout, wte_, shape());
  out_adapter_ = OutputAdapter{};
  if (has(adapter) && adapters_enabled_) {  // lm_head.lora_A, lm_head.lora_B
    at::Tensor flat = gather(adapter);
    const auto& slots = unit(adapter).layout.slots;
    out_adapter_.a = slot_view(flat, slots[0]);
    out_adapter_.b = slot_view(flat, slots[1]);
    out_adapter_.scale = lora_scale(lora());
  }
  return head;
}

const OutputAdapter* FsdpModel::output_adapter() { return out_adapter_.a.defined() ? &out_adapter_ : nullptr; }

void FsdpModel::head_done() {
  if (!training_ && out_adapter_.a.defined()) release(head_unit(UnitRole::adapter));
  // A tied head whose backward recomputes logits (token_logprobs) keeps the embedding gathered:
  // its reduce-scatter (trained) or finish_backward (frozen) frees it.
  if (shape().tie_embeddings && !(training_ && head_backward_)) release({UnitRole::base, kEmbeddingUnit});
  // The head stays gathered for its backward (the final norm needs its weight), unless no
  // backward will come.
  if (!training_) release(head_unit(UnitRole::base));
  wte_ = at::Tensor();
  out_adapter_ = OutputAdapter{};
}

const RopeTables& FsdpModel::batch_rope(const at::Tensor& inputs, const at::Tensor& doc_ids) {
  const int64_t T = inputs.size(1), window = shape().sliding_window;
  batch_rope_ = doc_ids.defined() ? packed_positions(rope(T), doc_ids, policy_.compute_dtype, window)
                                  : windowed_positions(rope(T), T, window, policy_.compute_dtype);
  return batch_rope_;
}

at::Tensor FsdpModel::forward_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                                   const at::Tensor& doc_ids, at::Tensor* stats) {
  return llama_loss(*this, shape(), batch_rope(inputs, doc_ids), inputs, targets, loss_chunk, policy_.logits_dtype,
                    options_.kernels.fused_loss, stats);
}

at::Tensor FsdpModel::token_logprobs(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                                     at::Tensor* stats) {
  head_backward_ = true;  // linear_token_logprobs' backward reads the head's weights
  at::Tensor logps;
  try {
    logps = llama_token_logprobs(*this, shape(), batch_rope(inputs, at::Tensor()), inputs, targets, loss_chunk,
                                 policy_.logits_dtype, options_.kernels.fused_loss, stats);
  } catch (...) {
    head_backward_ = false;
    throw;
  }
  head_backward_ = false;
  return logps;
}

void FsdpModel::set_adapters_enabled(bool enabled) { adapters_enabled_ = enabled; }

LossSum FsdpModel::eval_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                             const at::Tensor& doc_ids, bool token_stats) {
  return llama_loss_sum(*this, shape(), batch_rope(inputs, doc_ids), inputs, targets, loss_chunk, policy_.logits_dtype,
                        options_.kernels.fused_loss, token_stats);
}

at::Tensor FsdpModel::next_logits(const at::Tensor& inputs, KvCache& cache) {
  const int64_t T = inputs.size(1);
  const RopeTables r = cached_positions(rope(cache.length + T), cache, T);
  at::Tensor logits = llama_next_logits(*this, shape(), r, inputs);
  cache.length += T;
  return logits;
}

at::Tensor FsdpModel::logits(const at::Tensor& inputs) {
  return llama_logits(*this, shape(), batch_rope(inputs, at::Tensor()), inputs);
}

}  // namespace ptrain
