#include "parallel/fsdp.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef PTRAIN_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <mutex>
#include <optional>

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
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& shard, FsdpModel* model, int64_t unit);
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

class FsdpModel::OnBackward : public torch::autograd::Function<FsdpModel::OnBackward> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, FsdpModel* model, int64_t unit,
                            UnitAction action) {
    ctx->saved_data["model"] = saved_ref(model);
    ctx->saved_data["unit"] = unit;
    ctx->saved_data["action"] = static_cast<int64_t>(action);
    return x.view_as(x);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto unit = static_cast<size_t>(ctx->saved_data["unit"].toInt());
    if (static_cast<UnitAction>(ctx->saved_data["action"].toInt()) == UnitAction::regather)
      model_of(ctx)->regather(unit);
    else
      model_of(ctx)->release_frozen(unit);
    return {grads[0], at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

at::Tensor FsdpModel::GatherUnit::forward(AutogradContext* ctx, const at::Tensor& shard, FsdpModel* model,
                                          int64_t unit) {
  ctx->saved_data["model"] = saved_ref(model);
  ctx->saved_data["unit"] = unit;
  return model->fill(static_cast<size_t>(unit));
}

variable_list FsdpModel::GatherUnit::backward(AutogradContext* ctx, variable_list grads) {
  FsdpModel* model = model_of(ctx);
  return {model->reduce_grad(static_cast<size_t>(ctx->saved_data["unit"].toInt()), grads[0]), at::Tensor(),
          at::Tensor()};
}

// A whole block under full activation checkpointing: forward gathers, computes without a
// graph and frees the weights, keeping only the block's input; backward re-gathers,
// recomputes with a graph, differentiates w.r.t. the input and the trained weights — the block's
// own, or with LoRA its adapters over the frozen (dense or NF4) base — and reduce-scatters them.
class FsdpModel::CheckpointedBlock : public torch::autograd::Function<FsdpModel::CheckpointedBlock> {
 public:
  // `trained` is what autograd differentiates besides x: the block's shard, or its adapter shard.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& trained, FsdpModel* model,
                            int64_t unit) {
    ctx->saved_data["model"] = saved_ref(model);
    ctx->saved_data["unit"] = unit;
    if (ActivationOffloader* offloader = model->offloader())
      ctx->saved_data["ticket"] = offloader->offload(x);
    else
      ctx->save_for_backward({x});
    if (model->options().lora.dropout > 0) {  // the recompute must draw the same masks
      at::Generator gen = default_generator(model->device());
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    model->fill_block(unit);
    model->prefetch_block(unit + 1);
    at::Tensor y = model->compute_block(unit, x);
    model->release_block(unit);
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    FsdpModel* model = model_of(ctx);
    const auto unit = static_cast<size_t>(ctx->saved_data["unit"].toInt());
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
    at::Tensor w = model->fill_block(unit).detach().requires_grad_(trains);
    if (unit > kFirstBlockUnit) model->prefetch_block(unit - 1);  // the previous block's backward comes next
    at::Tensor y;
    {
      std::optional<RngStateScope> rng;
      if (ctx->saved_data.count("rng"))
        rng.emplace(default_generator(model->device()), ctx->saved_data["rng"].toTensor());
      at::AutoGradMode grad_on(true);
      y = model->compute_block(unit, x, trains ? w : at::Tensor());
    }
    if (!trains) {
      at::Tensor gx = torch::autograd::grad({y}, {x}, {grads[0]})[0];
      model->release_block(unit);
      return {gx, at::Tensor(), at::Tensor(), at::Tensor()};
    }
    auto g = torch::autograd::grad({y}, {x, w}, {grads[0]});
    return {g[0], model->reduce_block_grad(unit, g[1]), at::Tensor(), at::Tensor()};
  }
};

at::Tensor FsdpModel::gather(size_t unit) {
  if (!at(unit).shard.requires_grad()) return fill(unit);  // frozen: nothing to differentiate
  return GatherUnit::apply(at(unit).shard, this, static_cast<int64_t>(unit));
}

at::Tensor FsdpModel::compute_block(size_t unit, const at::Tensor& x, const at::Tensor& trained) {
  const bool lora = has_adapter(unit);
  const at::Tensor w = !lora && trained.defined() ? trained : gathered_view(unit);
  BlockLora l;
  if (lora)
    l = BlockLora::from_flat(trained.defined() ? trained : gathered_view(adapter(unit)), adapters_[unit].layout, shape_,
                             lora_scale(options_.lora), options_.lora.dropout, true);
  const BlockWeights bw = options_.quant.nf4() ? BlockWeights::from_nf4(w, units_[unit].layout, nf4_weights(unit))
                                               : BlockWeights::from_flat(w, units_[unit].layout);
  return block_forward(bw, x, batch_rope_, shape_, lora ? &l : nullptr);
}

const RopeTables& FsdpModel::rope(int64_t seq_len) {
  if (seq_len > rope_len_) {
    rope_ = rope_tables(shape_, std::max(seq_len, std::min<int64_t>(shape_.max_seq_len, 2 * seq_len)), device_);
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
  at::Tensor embed = gather(kEmbeddingUnit);
  prefetch_block(kFirstBlockUnit);
  wte_ = embedding_weight(embed, units_[kEmbeddingUnit].layout);
  return wte_;
}

void FsdpModel::embedding_done() {
  if (!shape_.tie_embeddings) release(kEmbeddingUnit);  // the embedding's backward needs no weights
}

at::Tensor FsdpModel::block(int64_t layer, const at::Tensor& input, const RopeTables& rope) {
  const size_t i = block_unit(layer);
  if (training_ && options_.memory.checkpointing())
    return CheckpointedBlock::apply(input, has_adapter(i) ? adapters_[i].shard : units_[i].shard, this,
                                    static_cast<int64_t>(i));
  at::Tensor x = input;
  at::Tensor w = gather(i);
  at::Tensor a = has_adapter(i) ? gather(adapter(i)) : at::Tensor();
  fill_nf4(i);
  prefetch_block(i + 1);  // gathers while this block computes
  BlockLora lora;
  if (a.defined())
    lora = BlockLora::from_flat(a, adapters_[i].layout, shape_, lora_scale(options_.lora), options_.lora.dropout,
                                training_);
  // A frozen block gets no reduce-scatter to release it: release once its backward is done.
  if (options_.lora.enabled && training_ && x.requires_grad())
    x = OnBackward::apply(x, this, static_cast<int64_t>(i), UnitAction::release);
  const BlockWeights bw = options_.quant.nf4() ? BlockWeights::from_nf4(w, units_[i].layout, nf4_weights(i))
                                               : BlockWeights::from_flat(w, units_[i].layout);
  x = block_forward(bw, x, rope, shape_, a.defined() ? &lora : nullptr, cache_layer(rope, layer));
  if (!training_ || options_.parallel.reshard_after_forward) {
    release_block(i);
    if (training_) x = OnBackward::apply(x, this, static_cast<int64_t>(i), UnitAction::regather);
  }
  return x;
}

HeadWeights FsdpModel::head() {
  const size_t h = units_.size() - 1;
  HeadWeights head = HeadWeights::from_flat(gather(h), units_[h].layout, wte_, shape_);
  out_adapter_ = OutputAdapter{};
  if (has_adapter(h)) {  // lm_head.lora_A, lm_head.lora_B
    at::Tensor flat = gather(adapter(h));
    const auto& slots = adapters_[h].layout.slots;
    out_adapter_.a = slot_view(flat, slots[0]);
    out_adapter_.b = slot_view(flat, slots[1]);
    out_adapter_.scale = lora_scale(options_.lora);
  }
  return head;
}

const OutputAdapter* FsdpModel::output_adapter() { return out_adapter_.a.defined() ? &out_adapter_ : nullptr; }

void FsdpModel::head_done() {
  const size_t h = units_.size() - 1;
  if (!training_ && out_adapter_.a.defined()) release(adapter(h));
  if (shape_.tie_embeddings) release(0);
  // The head stays gathered for its backward (the final norm needs its weight), unless no
  // backward will come.
  if (!training_) release(h);
  wte_ = at::Tensor();
  out_adapter_ = OutputAdapter{};
}

const RopeTables& FsdpModel::batch_rope(const at::Tensor& inputs, const at::Tensor& doc_ids) {
  const int64_t T = inputs.size(1), window = shape_.sliding_window;
  batch_rope_ = doc_ids.defined() ? packed_positions(rope(T), doc_ids, policy_.compute_dtype, window)
                                  : windowed_positions(rope(T), T, window, policy_.compute_dtype);
  return batch_rope_;
}

at::Tensor FsdpModel::forward_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                                   const at::Tensor& doc_ids) {
  return llama_loss(*this, shape_, batch_rope(inputs, doc_ids), inputs, targets, loss_chunk, policy_.logits_dtype);
}

LossSum FsdpModel::eval_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                             const at::Tensor& doc_ids) {
  return llama_loss_sum(*this, shape_, batch_rope(inputs, doc_ids), inputs, targets, loss_chunk, policy_.logits_dtype);
}

at::Tensor FsdpModel::next_logits(const at::Tensor& inputs, KvCache& cache) {
  const int64_t T = inputs.size(1);
  const RopeTables r = cached_positions(rope(cache.length + T), cache, T);
  at::Tensor logits = llama_next_logits(*this, shape_, r, inputs);
  cache.length += T;
  return logits;
}

at::Tensor FsdpModel::logits(const at::Tensor& inputs) {
  return llama_logits(*this, shape_, batch_rope(inputs, at::Tensor()), inputs);
}

}  // namespace ptrain
