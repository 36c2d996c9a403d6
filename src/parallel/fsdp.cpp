#include "parallel/fsdp.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/Generator.h>
#include <c10/core/StorageImpl.h>
#include <torch/csrc/autograd/autograd.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef PTRAIN_CUDA
#include <ATen/cuda/CUDAGeneratorImpl.h>
#endif

#include <mutex>
#include <optional>
#include <utility>

#include "common/error.h"
#include "common/hash.h"

namespace ptrain {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

namespace {

FsdpModel* model_of(AutogradContext* ctx) {
  return reinterpret_cast<FsdpModel*>(ctx->saved_data["model"].toInt());
}

// Shard -> gathered unit in the compute dtype; backward reduce-scatters the unit's gradient.
class GatherUnit : public torch::autograd::Function<GatherUnit> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& shard, FsdpModel* model, int64_t unit);
  static variable_list backward(AutogradContext* ctx, variable_list grads);
};

// Identity on a block's activation whose backward acts on the block's gathered weights:
// on the block's output, `regather` puts freed weights back before any of the block's own
// backward ops run; on a frozen (LoRA) block's input, `release` frees them once the block's
// backward is done (a frozen unit gets no reduce-scatter that would).
enum class UnitAction : int64_t { regather, release };

class OnBackward : public torch::autograd::Function<OnBackward> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, FsdpModel* model, int64_t unit, UnitAction action) {
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
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

void free_storage(const at::Tensor& t) {
  if (t.defined()) t.storage().unsafeGetStorageImpl()->reset();
}

bool storage_freed(const at::Tensor& t) { return t.storage().nbytes() == 0; }

void alloc_storage(const at::Tensor& t) {
  c10::StorageImpl* impl = t.storage().unsafeGetStorageImpl();
  const size_t nbytes = t.numel() * t.element_size();
  impl->set_data_ptr_noswap(impl->allocator()->allocate(nbytes));
  impl->set_nbytes(nbytes);
}

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

// Decorrelated generator seeds per unit.
uint64_t mix_seed(uint64_t seed, uint64_t stream) { return mix64(seed + kGolden64 * (stream + 1)); }

// Copies the part of `slot` that lies in this rank's shard of `u` from `src` (the whole tensor,
// any shape); the rest of `src` is never read.
void copy_rank_slice(FlatUnit& u, const ParamSlot& slot, const at::Tensor& src) {
  const int64_t a = std::max(u.shard_offset, slot.offset), b = std::min(u.shard_offset + u.owned(), slot.offset + slot.numel);
  if (a < b) u.shard.detach().narrow(0, a - u.shard_offset, b - a).copy_(src.reshape({-1}).narrow(0, a - slot.offset, b - a));
}

}  // namespace

at::Tensor GatherUnit::forward(AutogradContext* ctx, const at::Tensor& shard, FsdpModel* model, int64_t unit) {
  ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
  ctx->saved_data["unit"] = unit;
  return model->fill(static_cast<size_t>(unit));
}

variable_list GatherUnit::backward(AutogradContext* ctx, variable_list grads) {
  FsdpModel* model = model_of(ctx);
  return {model->reduce_grad(static_cast<size_t>(ctx->saved_data["unit"].toInt()), grads[0]), at::Tensor(), at::Tensor()};
}

// A whole block under full activation checkpointing: forward gathers, computes without a
// graph and frees the weights, keeping only the block's input; backward re-gathers,
// recomputes with a graph, differentiates w.r.t. the input and the trained weights — the block's
// own, or with LoRA its adapters over the frozen (dense or NF4) base — and reduce-scatters them.
class CheckpointedBlock : public torch::autograd::Function<CheckpointedBlock> {
 public:
  // `trained` is what autograd differentiates besides x: the block's shard, or its adapter shard.
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& trained, FsdpModel* model,
                            int64_t unit) {
    ctx->saved_data["model"] = reinterpret_cast<int64_t>(model);
    ctx->saved_data["unit"] = unit;
    if (ActivationOffloader* offloader = model->offloader())
      ctx->saved_data["ticket"] = offloader->offload(x);
    else
      ctx->save_for_backward({x});
    if (model->options().lora_dropout > 0) {  // the recompute must draw the same masks
      at::Generator gen = default_generator(model->device());
      std::lock_guard<std::mutex> lock(gen.mutex());
      ctx->saved_data["rng"] = gen.get_state();
    }
    model->fill_block(unit);
    model->prefetch_block(unit + 1);
    at::Tensor y = model->block(unit, x);
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
    if (unit > 1) model->prefetch_block(unit - 1);  // the previous block's backward comes next
    at::Tensor y;
    {
      std::optional<RngStateScope> rng;
      if (ctx->saved_data.count("rng")) rng.emplace(default_generator(model->device()), ctx->saved_data["rng"].toTensor());
      at::AutoGradMode grad_on(true);
      y = model->block(unit, x, trains ? w : at::Tensor());
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

bool FsdpModel::aliases_shard(size_t unit) const {
  return comm_->world_size() == 1 && at(unit).shard.scalar_type() == at(unit).gathered.scalar_type();
}

UnitLayout nf4_unit_layout(const UnitLayout& block, bool double_quant) {
  static const char* const kGroups[4] = {"qkv", "o", "gate_up", "down"};
  UnitLayout l;
  l.name = block.name + ".nf4";
  l.kind = UnitKind::block;
  l.layer = block.layer;
  const auto groups = block_matrix_groups(block);
  TORCH_CHECK(groups.size() == 4, "a block has 4 matrix groups");
  for (size_t g = 0; g < 4; ++g) {
    int64_t n = 0;
    for (const auto& slot : groups[g]) n += slot.numel;
    ParamSlot s;
    s.name = "model.layers." + std::to_string(block.layer) + ".nf4." + kGroups[g];
    s.numel = nf4::byte_layout(n, double_quant).bytes;
    s.shape = {s.numel};
    s.offset = l.numel;
    l.group_begins.push_back(s.offset);
    l.numel += s.numel;
    l.slots.push_back(std::move(s));
  }
  return l;
}

namespace {
FlatUnit make_unit(UnitLayout layout, int64_t ws, int64_t rank, c10::ScalarType shard_dtype, c10::ScalarType compute_dtype,
                   const at::Device& device, bool trainable) {
  FlatUnit u;
  u.shard_numel = shard_numel(layout.numel, ws);
  u.shard_offset = rank * u.shard_numel;
  u.shard = at::zeros({u.shard_numel}, at::TensorOptions().dtype(shard_dtype).device(device));
  u.shard.set_requires_grad(trainable);
  u.gathered = at::empty({u.shard_numel * ws}, at::TensorOptions().dtype(compute_dtype).device(device));
  free_storage(u.gathered);  // allocated on demand (never, when the shard is used in place)
  u.layout = std::move(layout);
  return u;
}
}  // namespace

FsdpModel::FsdpModel(const LlamaShape& shape, const PrecisionPolicy& policy, const at::Device& device, double init_std,
                     std::shared_ptr<Collectives> comm, FsdpOptions options)
    : shape_(shape), policy_(policy), device_(device), comm_(std::move(comm)), options_(options) {
  const int64_t ws = comm_->world_size(), rank = comm_->rank();
  // A frozen base needs no master copy: it is stored in the compute dtype.
  const auto base_dtype = options_.lora ? policy.compute_dtype : policy.master_dtype;
  full_layouts_ = llama_units(shape, init_std);
  auto layouts = options_.nf4_base ? llama_units_without_block_matrices(shape, init_std) : full_layouts_;
  for (auto& layout : layouts)
    units_.push_back(make_unit(std::move(layout), ws, rank, base_dtype, policy.compute_dtype, device, !options_.lora));
  if (options_.lora)
    for (auto& layout : lora_units(shape, options_.lora_targets, options_.lora_rank))
      adapters_.push_back(make_unit(std::move(layout), ws, rank, policy.master_dtype, policy.compute_dtype, device, true));
  nf4_.resize(units_.size());
  if (options_.nf4_base)
    for (const auto& full : full_layouts_) {
      UnitLayout layout = full.kind == UnitKind::block ? nf4_unit_layout(full, options_.double_quant) : UnitLayout{};
      nf4_units_.push_back(make_unit(std::move(layout), ws, rank, at::kByte, at::kByte, device, false));
    }
  gathering_.resize(units_.size() + adapters_.size() + nf4_units_.size());
  if (options_.activation_offloading) {
    TORCH_CHECK(options_.activation_checkpointing, "activation offloading moves the checkpointed blocks' inputs: it needs activation checkpointing");
    offloader_ = std::make_unique<ActivationOffloader>(device_);
  }
  // The NF4 weights view their byte unit's gathered buffer, bound each time it is filled (or
  // the shard, used in place at one rank, bound once here).
  for (size_t i = 0; i < nf4_units_.size(); ++i) {
    if (!has_nf4(i)) continue;
    const auto groups = block_matrix_groups(full_layouts_[i]);
    for (size_t g = 0; g < 4; ++g) {
      auto q = std::make_unique<nf4::Quantized>();
      int64_t rows = 0;
      for (const auto& slot : groups[g]) rows += slot.shape[0];
      q->shape = {rows, groups[g].front().shape[1]};
      q->numel = rows * q->shape[1];
      q->double_quant = options_.double_quant;
      nf4_[i][g] = std::move(q);
    }
    if (aliases_shard(nf4_unit(i))) bind_nf4(i);
  }
}

void FsdpModel::bind_nf4(size_t unit) {
  const at::Tensor bytes = gathered_view(nf4_unit(unit));
  for (size_t g = 0; g < 4; ++g) nf4::bind_bytes(*nf4_[unit][g], slot_view(bytes, nf4_units_[unit].layout.slots[g]));
}

FlatUnit& FsdpModel::at(size_t unit) { return const_cast<FlatUnit&>(std::as_const(*this).at(unit)); }

const FlatUnit& FsdpModel::at(size_t unit) const {
  if (unit < units_.size()) return units_[unit];
  unit -= units_.size();
  if (unit < adapters_.size()) return adapters_[unit];
  return nf4_units_.at(unit - adapters_.size());
}

std::vector<size_t> FsdpModel::companions(size_t unit) const {
  std::vector<size_t> out;
  if (unit >= units_.size()) return out;
  if (has_nf4(unit)) out.push_back(nf4_unit(unit));
  if (has_adapter(unit)) out.push_back(adapter(unit));
  return out;
}

void FsdpModel::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < units_.size(); ++i) {
    if (!options_.nf4_base || units_[i].layout.kind != UnitKind::block) {
      init_unit(units_[i], mix_seed(seed, i));
      continue;
    }
    // The same numbers a dense model draws (the full unit), then the matrices are quantized.
    FlatUnit full;
    full.layout = full_layouts_[i];
    full.shard_numel = full.layout.numel;
    full.shard = at::zeros({full.layout.numel}, at::kFloat);
    init_unit(full, mix_seed(seed, i));
    std::vector<at::Tensor> groups;
    for (const auto& g : block_matrix_groups(full.layout)) {
      const int64_t begin = g.front().offset, end = g.back().offset + g.back().numel;
      groups.push_back(full.shard.narrow(0, begin, end - begin).view({-1, g.front().shape[1]}));
    }
    quantize_block(i, groups);
    FlatUnit& u = units_[i];
    u.shard.zero_();
    for (const auto& slot : u.layout.slots) {  // the norms
      copy_rank_slice(u, slot, full.shard.narrow(0, full.layout.offset_of(slot.name), slot.numel));
    }
  }
  init_adapters(seed);
}

// Every rank quantizes each whole group (double quantization's scales span the group) and keeps
// the bytes that fall in its shard.
void FsdpModel::quantize_block(size_t unit, const std::vector<at::Tensor>& groups) {
  TORCH_CHECK(groups.size() == 4, "a block has 4 matrix groups");
  FlatUnit& u = nf4_units_.at(unit);
  u.shard.zero_();
  for (size_t g = 0; g < 4; ++g) {
    const nf4::Quantized q = nf4::quantize(groups[g], options_.double_quant);  // on the CPU
    const ParamSlot& slot = u.layout.slots[g];
    at::Tensor bytes = at::empty({slot.numel}, at::kByte);
    nf4::write_bytes(q, bytes);
    copy_rank_slice(u, slot, bytes);
    nf4_[unit][g]->offset = q.offset;
  }
}

int64_t FsdpModel::nf4_bytes() const {
  int64_t n = 0;
  for (const auto& u : nf4_units_) n += u.shard.nbytes();
  return n;
}

int64_t FsdpModel::nf4_params() const {
  int64_t n = 0;
  for (const auto& groups : nf4_)
    for (const auto& q : groups) n += q ? q->numel : 0;
  return n;
}

void FsdpModel::init_adapters(uint64_t seed) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < adapters_.size(); ++i) init_unit(adapters_[i], mix_seed(seed ^ 0x4C6F5241ull, i));
}

void FsdpModel::init_unit(FlatUnit& u, uint64_t seed) {
  {
    // The whole unit is drawn (one unit at a time) so every world size gets the same numbers.
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(seed);
    at::Tensor flat = at::zeros({u.layout.numel}, at::kFloat);  // alignment padding stays 0
    for (const auto& slot : u.layout.slots) {
      at::Tensor part = flat.narrow(0, slot.offset, slot.numel);
      if (slot.init == SlotInit::kaiming_uniform) {
        const double bound = 1.0 / std::sqrt(static_cast<double>(slot.shape.back()));
        part.uniform_(-bound, bound, gen);
      } else if (slot.init == SlotInit::zeros) {
        part.zero_();
      } else if (slot.init_std > 0) {
        part.normal_(0.0, slot.init_std, gen);
      } else {
        part.fill_(1.0);
      }
    }
    u.shard.zero_();
    if (u.owned() > 0) u.shard.narrow(0, 0, u.owned()).copy_(flat.narrow(0, u.shard_offset, u.owned()));
  }
}

void FsdpModel::load(const TensorByName& tensor) {
  at::NoGradGuard no_grad;
  if (options_.nf4_base) {
    // One matrix group at a time: read it from the memory-mapped files, quantize, drop it; the
    // full-precision model never exists in memory.
    for (size_t i = 0; i < units_.size(); ++i) {
      if (units_[i].layout.kind != UnitKind::block) continue;
      std::vector<at::Tensor> groups;
      for (const auto& g : block_matrix_groups(full_layouts_[i])) {
        std::vector<at::Tensor> parts;
        for (const auto& slot : g) {
          at::Tensor src = tensor(slot.name);
          if (src.sizes().vec() != slot.shape)
            throw RuntimeError("HF tensor '" + slot.name + "' has shape " + c10::str(src.sizes()) + ", the model expects " +
                               c10::str(c10::IntArrayRef(slot.shape)));
          parts.push_back(src);
        }
        groups.push_back(parts.size() == 1 ? parts[0] : at::cat(parts));
      }
      quantize_block(i, groups);
    }
  }
  for (auto& u : units_) {
    u.shard.zero_();
    for (const auto& slot : u.layout.slots) {
      at::Tensor src = tensor(slot.name);  // a view of the mapped file: only the slice copied is read
      if (src.sizes().vec() != slot.shape)
        throw RuntimeError("HF tensor '" + slot.name + "' has shape " + c10::str(src.sizes()) + ", the model expects " +
                           c10::str(c10::IntArrayRef(slot.shape)));
      copy_rank_slice(u, slot, src);
    }
  }
}

void FsdpModel::load_adapters(const std::map<std::string, at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  size_t used = 0;
  for (auto& u : adapters_) {
    u.shard.detach().zero_();
    for (const auto& slot : u.layout.slots) {
      auto it = tensors.find(slot.name);
      if (it == tensors.end()) throw RuntimeError("the adapter has no tensor '" + slot.name + "'; its targets differ from lora.targets");
      ++used;
      if (it->second.sizes().vec() != slot.shape)
        throw RuntimeError("adapter tensor '" + slot.name + "' has shape " + c10::str(it->second.sizes()) + ", lora.rank and the model give " +
                           c10::str(c10::IntArrayRef(slot.shape)));
      copy_rank_slice(u, slot, it->second);
    }
  }
  if (used != tensors.size())
    throw RuntimeError("the adapter holds " + std::to_string(tensors.size() - used) + " tensor(s) for projections lora.targets does not list");
}

at::Tensor FsdpModel::gather(size_t unit) {
  if (!at(unit).shard.requires_grad()) return fill(unit);  // frozen: nothing to differentiate
  return GatherUnit::apply(at(unit).shard, this, static_cast<int64_t>(unit));
}

void FsdpModel::release(size_t unit) {
  if (gathering_[unit]) {  // never free a buffer a collective is still writing
    gathering_[unit]->wait();
    gathering_[unit].reset();
  }
  free_storage(at(unit).gathered);
}

at::Tensor FsdpModel::fill(size_t unit) {
  FlatUnit& u = at(unit);
  // One rank, same dtype: the shard is the whole unit already; use it in place (no copy,
  // nothing to free afterwards).
  if (aliases_shard(unit)) return gathered_view(unit);
  if (gathering_[unit]) {  // prefetched: complete it
    gathering_[unit]->wait();
    gathering_[unit].reset();
    return gathered_view(unit);
  }
  if (storage_freed(u.gathered)) allocate_gathered(unit);
  at::NoGradGuard no_grad;
  comm_->all_gather(u.gathered, u.shard.detach().to(u.gathered.scalar_type()));
  return gathered_view(unit);
}

void FsdpModel::allocate_gathered(size_t unit) {
  alloc_storage(at(unit).gathered);
  int64_t alive = 0;
  for (size_t i = 0; i < gathering_.size(); ++i) alive += storage_freed(at(i).gathered) ? 0 : 1;
  peak_gathered_ = std::max(peak_gathered_, alive);
}

void FsdpModel::prefetch(size_t unit) {
  if (!options_.prefetch || unit >= gathering_.size() || aliases_shard(unit) || gathering_[unit] || at(unit).layout.numel == 0) return;
  FlatUnit& u = at(unit);
  if (!storage_freed(u.gathered)) return;  // still gathered (reshard_after_forward = false)
  allocate_gathered(unit);
  at::NoGradGuard no_grad;
  gathering_[unit] = comm_->all_gather_async(u.gathered, u.shard.detach().to(u.gathered.scalar_type()));
}

at::Tensor FsdpModel::reduce_grad(size_t unit, const at::Tensor& grad) {
  FlatUnit& u = at(unit);
  complete_reduce();  // the previous unit's reduce-scatter overlapped this unit's backward
  if (comm_->world_size() == 1) {  // the mean over one rank is the gradient itself
    release(unit);
    deliver(unit, grad.to(policy_.master_dtype).reshape({u.shard_numel}));
    return at::Tensor();
  }
  const auto reduce = policy_.reduce_dtype;
  const int64_t total = u.shard_numel * comm_->world_size();
  at::Tensor padded;
  if (total == u.layout.numel && grad.scalar_type() == reduce) {
    padded = grad.contiguous();
  } else {
    padded = at::empty({total}, grad.options().dtype(reduce));
    padded.narrow(0, 0, u.layout.numel).copy_(grad);
    padded.narrow(0, u.layout.numel, total - u.layout.numel).zero_();
  }
  auto pending = std::make_unique<PendingReduce>();
  pending->unit = unit;
  pending->input = padded;
  pending->shard_grad = at::empty({u.shard_numel}, padded.options());
  pending->op = comm_->reduce_scatter_mean_async(pending->shard_grad, padded);
  reducing_ = std::move(pending);
  release(unit);  // this unit's backward is done: its gathered weights are not needed
  if (unit == 0) finish_backward();  // the embedding's gradient is the last of a backward pass
  return at::Tensor();
}

void FsdpModel::complete_reduce() {
  if (reducing_) {
    std::unique_ptr<PendingReduce> r = std::move(reducing_);
    r->op->wait();
    deliver(r->unit, r->shard_grad.to(policy_.master_dtype));
  }
}

void FsdpModel::finish_backward() {
  complete_reduce();
  // LoRA: frozen units (base, NF4 bytes) get no reduce-scatter that would release them.
  if (options_.lora)
    for (size_t i = 0; i < gathering_.size(); ++i)
      if (!at(i).shard.requires_grad() && (!storage_freed(at(i).gathered) || gathering_[i])) release(i);
}

void FsdpModel::deliver(size_t unit, const at::Tensor& shard_grad) {
  // used and dropped: nothing is stored (the index is the trainable unit's)
  if (on_grad_ready) return on_grad_ready(options_.lora ? unit - units_.size() : unit, shard_grad);
  at::Tensor& g = at(unit).shard.mutable_grad();
  if (g.defined())
    g.add_(shard_grad);  // gradient accumulation over micro-batches
  else
    g = shard_grad.contiguous();
}

at::Tensor FsdpModel::fill_block(size_t unit) {
  at::Tensor w = fill(unit);
  fill_nf4(unit);
  return has_adapter(unit) ? fill(adapter(unit)) : w;
}

void FsdpModel::prefetch_block(size_t unit) {
  prefetch(unit);
  for (size_t c : companions(unit)) prefetch(c);
}

void FsdpModel::release_block(size_t unit) {
  release(unit);
  for (size_t c : companions(unit)) release(c);
}

void FsdpModel::fill_nf4(size_t unit) {
  if (!has_nf4(unit)) return;
  fill(nf4_unit(unit));
  if (!aliases_shard(nf4_unit(unit))) bind_nf4(unit);
}

void FsdpModel::release_frozen(size_t unit) {
  release(unit);
  if (has_nf4(unit)) release(nf4_unit(unit));
}

std::array<const nf4::Quantized*, 4> FsdpModel::nf4_weights(size_t unit) const {
  const auto& q = nf4_.at(unit);
  return {q[0].get(), q[1].get(), q[2].get(), q[3].get()};
}

at::Tensor FsdpModel::gathered_view(size_t unit) {
  FlatUnit& u = at(unit);
  return aliases_shard(unit) ? u.shard.detach() : u.gathered.narrow(0, 0, u.layout.numel);
}

at::Tensor FsdpModel::block(size_t unit, const at::Tensor& x, const at::Tensor& trained) {
  const bool lora = has_adapter(unit);
  const at::Tensor w = !lora && trained.defined() ? trained : gathered_view(unit);
  BlockLora l;
  if (lora)
    l = BlockLora::from_flat(trained.defined() ? trained : gathered_view(adapter(unit)), adapters_[unit].layout, shape_,
                             options_.lora_alpha / static_cast<double>(options_.lora_rank), options_.lora_dropout, true);
  const BlockWeights bw = options_.nf4_base ? BlockWeights::from_nf4(w, units_[unit].layout, nf4_weights(unit).data())
                                            : BlockWeights::from_flat(w, units_[unit].layout, shape_);
  return block_forward(bw, x, rope(x.size(1)), shape_, lora ? &l : nullptr);
}

at::Tensor FsdpModel::reduce_block_grad(size_t unit, const at::Tensor& grad) {
  if (!has_adapter(unit)) return reduce_grad(unit, grad);
  release(unit);  // the frozen base gets no gradient
  return reduce_grad(adapter(unit), grad);
}

void FsdpModel::regather(size_t unit) {
  // Refill without bumping the version counter: autograd saved views of this buffer in
  // forward and checks that nobody modified them in between; the values are identical.
  at::AutoDispatchBelowADInplaceOrView guard;
  std::vector<size_t> members = companions(unit);
  members.insert(members.begin(), unit);
  for (size_t m : members)
    if (storage_freed(at(m).gathered) || gathering_[m]) fill(m);
  if (has_nf4(unit) && !aliases_shard(nf4_unit(unit))) bind_nf4(unit);
  if (unit > 1) prefetch_block(unit - 1);  // the previous block's backward comes next
}

const RopeTables& FsdpModel::rope(int64_t seq_len) {
  if (seq_len > rope_len_) {
    rope_ = rope_tables(shape_, std::max(seq_len, std::min<int64_t>(shape_.max_seq_len, 2 * seq_len)), device_);
    rope_len_ = rope_.cos.size(0);
  }
  return rope_;
}

template <class Head>
auto FsdpModel::forward(const at::Tensor& inputs, Head&& run_head) {
  const bool training = at::GradMode::is_enabled();
  const size_t head_unit = units_.size() - 1;
  if (training && offloader_) offloader_->begin_forward();
  const auto& rp = rope(inputs.size(1));
  at::Tensor embed = gather(0);
  prefetch_block(1);
  const at::Tensor wte = embedding_weight(embed, units_[0].layout);
  at::Tensor x = at::embedding(wte, inputs);
  if (!shape_.tie_embeddings) release(0);  // embedding backward needs no weights
  for (size_t i = 1; i < head_unit; ++i) {
    if (training && options_.activation_checkpointing) {
      x = CheckpointedBlock::apply(x, has_adapter(i) ? adapters_[i].shard : units_[i].shard, this, static_cast<int64_t>(i));
      continue;
    }
    at::Tensor w = gather(i);
    at::Tensor a = has_adapter(i) ? gather(adapter(i)) : at::Tensor();
    fill_nf4(i);
    prefetch_block(i + 1);  // gathers while this block computes
    BlockLora lora;
    if (a.defined()) lora = BlockLora::from_flat(a, adapters_[i].layout, shape_, options_.lora_alpha / static_cast<double>(options_.lora_rank),
                                                     options_.lora_dropout, training);
    // A frozen block gets no reduce-scatter to release it: release once its backward is done.
    if (options_.lora && training && x.requires_grad()) x = OnBackward::apply(x, this, static_cast<int64_t>(i), UnitAction::release);
    BlockWeights bw = options_.nf4_base ? BlockWeights::from_nf4(w, units_[i].layout, nf4_weights(i).data())
                                        : BlockWeights::from_flat(w, units_[i].layout, shape_);
    x = block_forward(bw, x, rp, shape_, a.defined() ? &lora : nullptr);
    if (!training || options_.reshard_after_forward) {
      release_block(i);
      if (training) x = OnBackward::apply(x, this, static_cast<int64_t>(i), UnitAction::regather);
    }
  }
  HeadWeights head = HeadWeights::from_flat(gather(head_unit), units_[head_unit].layout, wte, shape_);
  OutputAdapter out_adapter;
  if (has_adapter(head_unit)) {  // lm_head.lora_A, lm_head.lora_B
    at::Tensor flat = gather(adapter(head_unit));
    const auto& slots = adapters_[head_unit].layout.slots;
    out_adapter.a = slot_view(flat, slots[0]);
    out_adapter.b = slot_view(flat, slots[1]);
    out_adapter.scale = options_.lora_alpha / static_cast<double>(options_.lora_rank);
  }
  at::Tensor h = rms_norm(x, head.norm, shape_.norm_eps);
  auto result = run_head(h.reshape({-1, shape_.dim}), head.output, out_adapter.a.defined() ? &out_adapter : nullptr);
  if (!training && out_adapter.a.defined()) release(adapter(head_unit));
  if (shape_.tie_embeddings) release(0);
  // The head stays gathered for its backward (the final norm needs its weight), unless no
  // backward will come.
  if (!training) release(head_unit);
  return result;
}

at::Tensor FsdpModel::forward_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk) {
  return forward(inputs, [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
    return linear_cross_entropy(h, out, targets.reshape({-1}), loss_chunk, policy_.logits_dtype, adapter);
  });
}

LossSum FsdpModel::eval_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk) {
  at::NoGradGuard no_grad;
  return forward(inputs, [&](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
    return linear_cross_entropy_sum(h, out, targets.reshape({-1}), loss_chunk, policy_.logits_dtype, adapter);
  });
}

at::Tensor FsdpModel::logits(const at::Tensor& inputs) {
  at::NoGradGuard no_grad;
  return forward(inputs, [](const at::Tensor& h, const at::Tensor& out, const OutputAdapter* adapter) {
    at::Tensor logits = at::linear(h, out).to(at::kFloat);
    if (adapter) logits += at::linear(at::linear(h, adapter->a), adapter->b).to(at::kFloat) * adapter->scale;
    return logits;
  });
}

void FsdpModel::zero_grad() {
  for (auto& u : trainable_units()) u.shard.mutable_grad() = at::Tensor();
}

int64_t FsdpModel::num_params() const {
  int64_t n = 0;
  for (const auto& u : full_layouts_) n += u.numel;
  return n;
}

}  // namespace ptrain
