#include "parallel/fsdp.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>

#include "checkpoint/hf.h"
#include "common/error.h"

namespace ptrain {

at::Tensor FlatUnit::gather(c10::ScalarType compute_dtype) const { return shard.to(compute_dtype); }

FsdpModel::FsdpModel(const LlamaShape& shape, const PrecisionPolicy& policy, const at::Device& device,
                     double init_std)
    : shape_(shape), policy_(policy), device_(device) {
  for (auto& layout : llama_units(shape, init_std)) {
    FlatUnit u;
    u.shard = at::zeros({layout.numel}, at::TensorOptions().dtype(policy.master_dtype).device(device));
    u.shard.set_requires_grad(true);
    u.layout = std::move(layout);
    units_.push_back(std::move(u));
  }
}

static uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  // splitmix64 of (seed, stream): decorrelated generator seeds per unit.
  uint64_t z = seed + 0x9E3779B97F4A7C15ull * (stream + 1);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

void FsdpModel::init_weights(uint64_t seed) {
  at::NoGradGuard no_grad;
  for (size_t i = 0; i < units_.size(); ++i) {
    auto& u = units_[i];
    at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(mix_seed(seed, i));
    at::Tensor flat = at::empty({u.layout.numel}, at::kFloat);
    for (const auto& slot : u.layout.slots) {
      at::Tensor part = flat.narrow(0, slot.offset, slot.numel);
      if (slot.init_std > 0)
        part.normal_(0.0, slot.init_std, gen);
      else
        part.fill_(1.0);
    }
    u.shard.copy_(flat);
  }
}

void FsdpModel::load_hf(const HfCheckpoint& ckpt) {
  at::NoGradGuard no_grad;
  for (auto& u : units_)
    for (const auto& slot : u.layout.slots) {
      at::Tensor src = ckpt.tensor(slot.name);
      if (src.sizes().vec() != slot.shape)
        throw RuntimeError("HF tensor '" + slot.name + "' has shape " + c10::str(src.sizes()) + ", the model expects " +
                           c10::str(c10::IntArrayRef(slot.shape)));
      u.shard.narrow(0, slot.offset, slot.numel).copy_(src.reshape({-1}));
    }
}

const RopeTables& FsdpModel::rope(int64_t seq_len) {
  if (seq_len > rope_len_) {
    rope_ = rope_tables(shape_, std::max(seq_len, std::min<int64_t>(shape_.max_seq_len, 2 * seq_len)), device_);
    rope_len_ = rope_.cos.size(0);
  }
  return rope_;
}

std::pair<at::Tensor, at::Tensor> FsdpModel::hidden_and_output(const at::Tensor& inputs) {
  const auto dt = policy_.compute_dtype;
  const auto& rp = rope(inputs.size(1));
  at::Tensor embed = units_.front().gather(dt);
  at::Tensor x = at::embedding(embedding_weight(embed, shape_), inputs);
  for (size_t i = 1; i + 1 < units_.size(); ++i)
    x = block_forward(BlockWeights::from_flat(units_[i].gather(dt), shape_), x, rp, shape_);
  HeadWeights head = HeadWeights::from_flat(units_.back().gather(dt), embed, shape_);
  at::Tensor h = rms_norm(x, head.norm, shape_.norm_eps);
  return {h.reshape({-1, shape_.dim}), head.output};
}

at::Tensor FsdpModel::forward_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk) {
  auto [h, out] = hidden_and_output(inputs);
  return linear_cross_entropy(h, out, targets.reshape({-1}), loss_chunk);
}

LossSum FsdpModel::eval_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk) {
  at::NoGradGuard no_grad;
  auto [h, out] = hidden_and_output(inputs);
  return linear_cross_entropy_sum(h, out, targets.reshape({-1}), loss_chunk);
}

std::vector<std::pair<std::string, at::Tensor>> FsdpModel::named_parameters() const {
  std::vector<std::pair<std::string, at::Tensor>> out;
  for (const auto& u : units_)
    for (const auto& slot : u.layout.slots)
      out.emplace_back(slot.name, u.shard.detach().narrow(0, slot.offset, slot.numel).view(slot.shape));
  return out;
}

void FsdpModel::zero_grad() {
  for (auto& u : units_) u.shard.mutable_grad() = at::Tensor();
}

int64_t FsdpModel::num_params() const {
  int64_t n = 0;
  for (const auto& u : units_) n += u.layout.numel;
  return n;
}

}  // namespace ptrain
