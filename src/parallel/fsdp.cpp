#include "parallel/fsdp.h"

#include <ATen/ATen.h>
#include <c10/core/StorageImpl.h>

#include <utility>

// FsdpModel's unit storage and its collectives: shards, gathered buffers allocated and freed
// in place, all-gathers (prefetched), reduce-scatters (asynchronous), the units of a block.
// Autograd glue and the forward schedule: fsdp_forward.cpp; filling the units: weights.cpp.

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

bool FsdpModel::aliases_shard(UnitKey key) const {
  const FlatUnit& u = unit(key);
  return comm_->world_size() == 1 && u.shard.scalar_type() == u.gathered.scalar_type();
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

constexpr std::array<UnitRole, kUnitRoles> kRoles{UnitRole::base, UnitRole::adapter, UnitRole::nf4};
}  // namespace

FsdpModel::FsdpModel(ModelPlan plan, const PrecisionPolicy& policy, const at::Device& device,
                     std::shared_ptr<Collectives> comm, FsdpOptions options)
    : plan_(std::move(plan)), policy_(policy), device_(device), comm_(std::move(comm)), options_(options) {
  TORCH_CHECK(
      plan_.options.master_dtype == policy_.master_dtype && plan_.options.compute_dtype == policy_.compute_dtype,
      "the model plan's master/compute dtypes (", plan_.options.master_dtype, "/", plan_.options.compute_dtype,
      ") are not the precision policy's (", policy_.master_dtype, "/", policy_.compute_dtype, ")");
  const int64_t ws = comm_->world_size(), rank = comm_->rank();
  for (UnitRole role : kRoles) {
    for (const auto& u : plan_.units(role)) units_[role_index(role)].push_back(make_unit(u, ws, rank, device));
    gathering_[role_index(role)].resize(units(role).size());
  }
  nf4_.resize(units(UnitRole::base).size());
  if (options_.memory.activation_offloading) {
    TORCH_CHECK(options_.memory.checkpointing(),
                "activation offloading moves the checkpointed blocks' inputs: it needs activation checkpointing");
    offloader_ = std::make_unique<ActivationOffloader>(device_);
  }
  // The NF4 weights view their byte unit's gathered buffer, bound each time it is filled (or
  // the shard, used in place at one rank, bound once here).
  for (size_t i = 0; i < units(UnitRole::nf4).size(); ++i) {
    if (!has({UnitRole::nf4, i})) continue;
    for (const auto& group : block_matrix_groups(plan_.full[i]))
      for (const auto& module : group) {  // Proj order
        auto q = std::make_unique<nf4::Quantized>();
        q->shape = module.shape;
        q->numel = module.numel;
        q->double_quant = quant().double_quant;
        nf4_[i].push_back(std::move(q));
      }
    if (aliases_shard({UnitRole::nf4, i})) bind_nf4(i);
  }
}

void FsdpModel::bind_nf4(size_t piece) {
  const UnitKey key{UnitRole::nf4, piece};
  const at::Tensor bytes = gathered_view(key);
  for (size_t p = 0; p < nf4_[piece].size(); ++p)
    nf4::bind_bytes(*nf4_[piece][p], slot_view(bytes, unit(key).layout.slots[p]));
}

FlatUnit& FsdpModel::at(UnitKey key) { return units_[role_index(key.role)].at(key.piece); }

const FlatUnit& FsdpModel::unit(UnitKey key) const { return units_[role_index(key.role)].at(key.piece); }

bool FsdpModel::has(UnitKey key) const {
  const auto& role = units(key.role);
  return key.piece < role.size() && role[key.piece].layout.numel > 0;
}

std::vector<UnitKey> FsdpModel::companions(size_t piece) const {
  std::vector<UnitKey> out;
  for (UnitKey key : {UnitKey{UnitRole::nf4, piece}, UnitKey{UnitRole::adapter, piece}})
    if (has(key) && (key.role != UnitRole::adapter || adapters_enabled_)) out.push_back(key);
  return out;
}

int64_t FsdpModel::nf4_bytes() const {
  int64_t n = 0;
  for (const auto& u : units(UnitRole::nf4)) n += u.shard.nbytes();
  return n;
}

void FsdpModel::set_nf4_offset(size_t piece, Proj p, float offset) {
  nf4_.at(piece).at(static_cast<size_t>(p))->offset = offset;
}

void FsdpModel::release(UnitKey key) {
  auto& in_flight = gathering_[role_index(key.role)].at(key.piece);
  if (in_flight) {  // never free a buffer a collective is still writing
    in_flight->wait();
    in_flight.reset();
  }
  free_storage(at(key).gathered);
}

at::Tensor FsdpModel::fill(UnitKey key) {
  FlatUnit& u = at(key);
  // One rank, same dtype: the shard is the whole unit already; use it in place (no copy,
  // nothing to free afterwards).
  if (aliases_shard(key)) return gathered_view(key);
  auto& in_flight = gathering_[role_index(key.role)].at(key.piece);
  if (in_flight) {  // prefetched: complete it
    in_flight->wait();
    in_flight.reset();
    return gathered_view(key);
  }
  if (storage_freed(u.gathered)) allocate_gathered(key);
  start_gather(key)->wait();
  return gathered_view(key);
}

std::unique_ptr<PendingCollective> FsdpModel::start_gather(UnitKey key) {
  FlatUnit& u = at(key);
  at::NoGradGuard no_grad;
  // The shard cast into its own slot of the gathered buffer in one copy (the master's float32
  // to the compute dtype), then gathered in place: no cast copy to be copied again.
  u.gathered.narrow(0, comm_->rank() * u.shard_numel, u.shard_numel).copy_(u.shard.detach());
  return comm_->all_gather_in_place_async(u.gathered);
}

void FsdpModel::allocate_gathered(UnitKey key) {
  alloc_storage(at(key).gathered);
  int64_t alive = 0;
  for (const auto& role : units_)
    for (const auto& u : role) alive += storage_freed(u.gathered) ? 0 : 1;
  peak_gathered_ = std::max(peak_gathered_, alive);
}

void FsdpModel::prefetch(UnitKey key) {
  if (!options_.parallel.prefetch || !has(key) || aliases_shard(key) || gathering_[role_index(key.role)][key.piece])
    return;
  FlatUnit& u = at(key);
  if (!storage_freed(u.gathered)) return;  // still gathered (reshard_after_forward = false)
  allocate_gathered(key);
  at::NoGradGuard no_grad;
  gathering_[role_index(key.role)][key.piece] = start_gather(key);
}

at::Tensor FsdpModel::reduce_grad(UnitKey key, const at::Tensor& grad) {
  FlatUnit& u = at(key);
  complete_reduce();               // the previous unit's reduce-scatter overlapped this unit's backward
  if (comm_->world_size() == 1) {  // the mean over one rank is the gradient itself
    release(key);
    deliver(key, grad.to(policy_.master_dtype).reshape({u.shard_numel}));
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
  pending->key = key;
  pending->input = padded;
  pending->shard_grad = at::empty({u.shard_numel}, padded.options());
  pending->op = comm_->reduce_scatter_mean_async(pending->shard_grad, padded);
  reducing_ = std::move(pending);
  release(key);  // this unit's backward is done: its gathered weights are not needed
  // The embedding's gradient is the last of a backward pass.
  if (key == UnitKey{UnitRole::base, kEmbeddingUnit}) finish_backward();
  return at::Tensor();
}

void FsdpModel::complete_reduce() {
  if (reducing_) {
    std::unique_ptr<PendingReduce> r = std::move(reducing_);
    r->op->wait();
    deliver(r->key, r->shard_grad.to(policy_.master_dtype));
  }
}

void FsdpModel::finish_backward() {
  complete_reduce();
  // LoRA: frozen units (base, NF4 bytes) get no reduce-scatter that would release them.
  if (!lora().enabled) return;
  for (UnitRole role : {UnitRole::base, UnitRole::nf4})
    for (size_t i = 0; i < units(role).size(); ++i)
      if (!storage_freed(unit({role, i}).gathered) || gathering_[role_index(role)][i]) release({role, i});
}

void FsdpModel::deliver(UnitKey key, const at::Tensor& shard_grad) {
  // used and dropped: nothing is stored (the index is the trained unit's)
  if (on_grad_ready) return on_grad_ready(key.piece, shard_grad);
  at::Tensor& g = at(key).shard.mutable_grad();
  if (g.defined())
    g.add_(shard_grad);  // gradient accumulation over micro-batches
  else
    g = shard_grad.contiguous();
}

at::Tensor FsdpModel::fill_block(size_t piece) {
  at::Tensor w = fill({UnitRole::base, piece});
  fill_nf4(piece);
  return has({UnitRole::adapter, piece}) ? fill({UnitRole::adapter, piece}) : w;
}

void FsdpModel::prefetch_block(size_t piece) {
  prefetch({UnitRole::base, piece});
  for (UnitKey c : companions(piece)) prefetch(c);
}

void FsdpModel::release_block(size_t piece) {
  release({UnitRole::base, piece});
  for (UnitKey c : companions(piece)) release(c);
}

void FsdpModel::fill_nf4(size_t piece) {
  const UnitKey key{UnitRole::nf4, piece};
  if (!has(key)) return;
  fill(key);
  if (!aliases_shard(key)) bind_nf4(piece);
}

void FsdpModel::release_frozen(size_t piece) {
  release({UnitRole::base, piece});
  if (has({UnitRole::nf4, piece})) release({UnitRole::nf4, piece});
}

std::array<std::vector<const nf4::Quantized*>, kMatrixGroups> FsdpModel::nf4_weights(size_t piece) const {
  std::array<std::vector<const nf4::Quantized*>, kMatrixGroups> out;
  const auto& q = nf4_.at(piece);
  if (q.empty()) return out;
  auto proj = [&](Proj p) -> const nf4::Quantized* { return q.at(static_cast<size_t>(p)).get(); };
  out[static_cast<int>(MatrixGroup::qkv)] = {proj(Proj::q), proj(Proj::k), proj(Proj::v)};
  out[static_cast<int>(MatrixGroup::o)] = {proj(Proj::o)};
  out[static_cast<int>(MatrixGroup::gate_up)] = {proj(Proj::gate), proj(Proj::up)};
  out[static_cast<int>(MatrixGroup::down)] = {proj(Proj::down)};
  return out;
}

const nf4::Quantized* FsdpModel::nf4_weight(size_t piece, Proj p) const {
  const auto& q = nf4_.at(piece);
  return q.empty() ? nullptr : q.at(static_cast<size_t>(p)).get();
}

at::Tensor FsdpModel::gathered_view(UnitKey key) {
  FlatUnit& u = at(key);
  return aliases_shard(key) ? u.shard.detach() : u.gathered.narrow(0, 0, u.layout.numel);
}

at::Tensor FsdpModel::reduce_block_grad(size_t piece, const at::Tensor& grad) {
  if (!has({UnitRole::adapter, piece})) return reduce_grad({UnitRole::base, piece}, grad);
  release({UnitRole::base, piece});  // the frozen base gets no gradient
  return reduce_grad({UnitRole::adapter, piece}, grad);
}

void FsdpModel::regather(size_t piece) {
  // Refill without bumping the version counter: autograd saved views of this buffer in
  // forward and checks that nobody modified them in between; the values are identical.
  at::AutoDispatchBelowADInplaceOrView guard;
  std::vector<UnitKey> members = companions(piece);
  members.insert(members.begin(), UnitKey{UnitRole::base, piece});
  for (UnitKey m : members)
    if (storage_freed(unit(m).gathered) || gathering_[role_index(m.role)][m.piece]) fill(m);
  if (has({UnitRole::nf4, piece}) && !aliases_shard({UnitRole::nf4, piece})) bind_nf4(piece);
  if (piece > kFirstBlockUnit) prefetch_block(piece - 1);  // the previous block's backward comes next
}

void FsdpModel::zero_grad() {
  for (const auto& u : trained_units()) u.shard.mutable_grad() = at::Tensor();
}

}  // namespace ptrain
