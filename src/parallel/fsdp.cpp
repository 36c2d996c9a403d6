#include "parallel/fsdp.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <utility>

// FsdpModel's unit storage and its collectives: shards, gathered buffers allocated and freed
// in place, all-gathers (prefetched), reduce-scatters (asynchronous), the units of a block.
// Autograd glue and the forward schedule: fsdp_forward.cpp; filling the units: fill.cpp.

namespace ptrain {

namespace {

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

}  // namespace

bool FsdpModel::aliases_shard(size_t unit) const {
  return comm_->world_size() == 1 && at(unit).shard.scalar_type() == at(unit).gathered.scalar_type();
}

ModelPlan plan_model(const LlamaShape& shape, const PrecisionPolicy& policy, double init_std,
                     const FsdpOptions& options) {
  PlanOptions o;
  o.init_std = init_std;
  o.master_dtype = policy.master_dtype;
  o.compute_dtype = policy.compute_dtype;
  o.lora = options.lora;
  o.quant = options.quant;
  return ModelPlan::make(shape, o);
}

namespace {
// The planned unit's shard (this rank's slice, zero-padded) and its gathered buffer.
FlatUnit make_unit(const PlannedUnit& planned, int64_t ws, int64_t rank, const at::Device& device) {
  FlatUnit u;
  u.shard_numel = shard_numel(planned.layout.numel, ws);
  u.shard_offset = rank * u.shard_numel;
  u.shard = at::zeros({u.shard_numel}, at::TensorOptions().dtype(planned.stored).device(device));
  u.shard.set_requires_grad(planned.trained);
  u.gathered = at::empty({u.shard_numel * ws}, at::TensorOptions().dtype(planned.gathered).device(device));
  free_storage(u.gathered);  // allocated on demand (never, when the shard is used in place)
  u.layout = planned.layout;
  return u;
}
}  // namespace

FsdpModel::FsdpModel(const LlamaShape& shape, const PrecisionPolicy& policy, const at::Device& device, double init_std,
                     std::shared_ptr<Collectives> comm, FsdpOptions options)
    : shape_(shape),
      policy_(policy),
      device_(device),
      comm_(std::move(comm)),
      options_(options),
      plan_(plan_model(shape, policy, init_std, options)) {
  const int64_t ws = comm_->world_size(), rank = comm_->rank();
  for (const auto& u : plan_.base) units_.push_back(make_unit(u, ws, rank, device));
  for (const auto& u : plan_.adapters) adapters_.push_back(make_unit(u, ws, rank, device));
  for (const auto& u : plan_.nf4) nf4_units_.push_back(make_unit(u, ws, rank, device));
  nf4_.resize(units_.size());
  gathering_.resize(units_.size() + adapters_.size() + nf4_units_.size());
  if (options_.memory.activation_offloading) {
    TORCH_CHECK(options_.memory.checkpointing(),
                "activation offloading moves the checkpointed blocks' inputs: it needs activation checkpointing");
    offloader_ = std::make_unique<ActivationOffloader>(device_);
  }
  // The NF4 weights view their byte unit's gathered buffer, bound each time it is filled (or
  // the shard, used in place at one rank, bound once here).
  for (size_t i = 0; i < nf4_units_.size(); ++i) {
    if (!has_nf4(i)) continue;
    for (const auto& group : block_matrix_groups(plan_.full[i]))
      for (const auto& module : group) {  // Proj order
        auto q = std::make_unique<nf4::Quantized>();
        q->shape = module.shape;
        q->numel = module.numel;
        q->double_quant = options_.quant.double_quant;
        nf4_[i].push_back(std::move(q));
      }
    if (aliases_shard(nf4_unit(i))) bind_nf4(i);
  }
}

void FsdpModel::bind_nf4(size_t unit) {
  const at::Tensor bytes = gathered_view(nf4_unit(unit));
  for (size_t p = 0; p < nf4_[unit].size(); ++p)
    nf4::bind_bytes(*nf4_[unit][p], slot_view(bytes, nf4_units_[unit].layout.slots[p]));
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

int64_t FsdpModel::nf4_bytes() const {
  int64_t n = 0;
  for (const auto& u : nf4_units_) n += u.shard.nbytes();
  return n;
}

void FsdpModel::set_nf4_offset(size_t unit, Proj p, float offset) {
  nf4_.at(unit).at(static_cast<size_t>(p))->offset = offset;
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
  if (!options_.parallel.prefetch || unit >= gathering_.size() || aliases_shard(unit) || gathering_[unit] ||
      at(unit).layout.numel == 0)
    return;
  FlatUnit& u = at(unit);
  if (!storage_freed(u.gathered)) return;  // still gathered (reshard_after_forward = false)
  allocate_gathered(unit);
  at::NoGradGuard no_grad;
  gathering_[unit] = comm_->all_gather_async(u.gathered, u.shard.detach().to(u.gathered.scalar_type()));
}

at::Tensor FsdpModel::reduce_grad(size_t unit, const at::Tensor& grad) {
  FlatUnit& u = at(unit);
  complete_reduce();               // the previous unit's reduce-scatter overlapped this unit's backward
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
  release(unit);                                  // this unit's backward is done: its gathered weights are not needed
  if (unit == kEmbeddingUnit) finish_backward();  // the embedding's gradient is the last of a backward pass
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
  if (options_.lora.enabled)
    for (size_t i = 0; i < gathering_.size(); ++i)
      if (!at(i).shard.requires_grad() && (!storage_freed(at(i).gathered) || gathering_[i])) release(i);
}

void FsdpModel::deliver(size_t unit, const at::Tensor& shard_grad) {
  // used and dropped: nothing is stored (the index is the trainable unit's)
  if (on_grad_ready) return on_grad_ready(options_.lora.enabled ? unit - units_.size() : unit, shard_grad);
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

std::array<std::vector<const nf4::Quantized*>, kMatrixGroups> FsdpModel::nf4_weights(size_t unit) const {
  std::array<std::vector<const nf4::Quantized*>, kMatrixGroups> out;
  const auto& q = nf4_.at(unit);
  if (q.empty()) return out;
  auto proj = [&](Proj p) -> const nf4::Quantized* { return q.at(static_cast<size_t>(p)).get(); };
  out[static_cast<int>(MatrixGroup::qkv)] = {proj(Proj::q), proj(Proj::k), proj(Proj::v)};
  out[static_cast<int>(MatrixGroup::o)] = {proj(Proj::o)};
  out[static_cast<int>(MatrixGroup::gate_up)] = {proj(Proj::gate), proj(Proj::up)};
  out[static_cast<int>(MatrixGroup::down)] = {proj(Proj::down)};
  return out;
}

const nf4::Quantized* FsdpModel::nf4_weight(size_t unit, Proj p) const {
  const auto& q = nf4_.at(unit);
  return q.empty() ? nullptr : q.at(static_cast<size_t>(p)).get();
}

at::Tensor FsdpModel::gathered_view(size_t unit) {
  FlatUnit& u = at(unit);
  return aliases_shard(unit) ? u.shard.detach() : u.gathered.narrow(0, 0, u.layout.numel);
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
  if (unit > kFirstBlockUnit) prefetch_block(unit - 1);  // the previous block's backward comes next
}

void FsdpModel::zero_grad() {
  for (auto& u : trainable_units()) u.shard.mutable_grad() = at::Tensor();
}

}  // namespace ptrain
