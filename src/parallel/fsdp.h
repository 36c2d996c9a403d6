// FSDP units (ZeRO-3): each unit — the embedding, each transformer block, and the final
// norm + output — is one flat parameter buffer of which every rank holds a contiguous shard
// of shard_numel(numel, world_size) elements — ceil(numel / world_size) rounded up to
// kUnitAlign (model/layout.h), zero-padded at the end — as the master copy.
//
// Forward, per unit: all-gather the shards in the compute dtype (GatherUnit), run the model
// piece on views of the gathered buffer, and — with parallel.reshard_after_forward — free the
// gathered storage right away. Backward, per block: a hook on the block's output re-gathers
// the storage just before the block's backward runs; GatherUnit's backward then
// reduce-scatters (mean over ranks) the flat gradient into the shard's .grad() in the reduce
// dtype and frees the gathered storage again. The embedding's and the head's backward need no
// weights (the loss produces its gradients in forward), so they are never re-gathered.
#pragma once
#include <ATen/Tensor.h>

#include <array>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "model/forward.h"
#include "model/layout.h"
#include "model/llama.h"
#include "model/loss.h"
#include "model/plan.h"
#include "parallel/collectives.h"
#include "parallel/offload.h"
#include "parallel/options.h"
#include "parallel/precision.h"
#include "quant/nf4.h"

namespace ptrain {

struct FlatUnit {
  UnitLayout layout;
  int64_t shard_numel = 0;   // shard_numel(layout.numel, world_size): every rank's shard length
  int64_t shard_offset = 0;  // first element of this rank's shard in the unit
  at::Tensor shard;          // master parameters [shard_numel], leaf with requires_grad
  at::Tensor gathered;       // [shard_numel * world_size] compute-dtype buffer; storage freed when resharded
  // Elements of the unit this rank owns (excluding padding): [shard_offset, shard_offset + owned()).
  int64_t owned() const { return std::max<int64_t>(0, std::min(shard_numel, layout.numel - shard_offset)); }
};

// The sharded model. As a WeightSource it runs the Llama forward (model/forward.h) with each
// unit gathered just in time.
//
// It holds exactly the units of its plan (model/plan.h), addressed by UnitKey {role, piece}:
// the base units, LoRA adapter units and NF4 byte units of each piece. Callers read them
// (const); their values are filled through parallel/weights.h, checkpoints and the optimizer,
// which write into the shards' storage, never replace a unit.
class FsdpModel : public WeightSource {
 public:
  // `plan` (ModelPlan::make) decides the units, their dtypes and what is trained; its master and
  // compute dtypes must be `policy`'s.
  FsdpModel(ModelPlan plan, const PrecisionPolicy& policy, const at::Device& device, std::shared_ptr<Collectives> comm,
            FsdpOptions options = {});
  const ModelPlan& plan() const { return plan_; }

  // Mean cross-entropy over unmasked targets of this rank's batch. inputs/targets: [B, T].
  // doc_ids [B, T] (optional): the batch packs several documents per row; positions restart and
  // attention stays within each document (packed_positions in model/llama.h).
  // `stats` (when non-null) receives each token's TokenStat columns [B*T, TokenStat::count]
  // (model/loss.h; no autograd): TRL's SFT token metrics.
  at::Tensor forward_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                          const at::Tensor& doc_ids = at::Tensor(), at::Tensor* stats = nullptr);
  // Per-token log-probabilities of targets [B, T] as float32 [B*T], 0 where masked (preference
  // objectives; autograd when grad mode is on); `stats` (when non-null) receives each
  // token's TokenStat columns [B*T, TokenStat::count] (model/loss.h; no autograd).
  at::Tensor token_logprobs(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                            at::Tensor* stats = nullptr);
  // With LoRA: forwards run on the frozen base alone while false (the reference of DPO); only
  // without autograd. The adapters' units are not gathered meanwhile.
  void set_adapters_enabled(bool enabled);
  bool adapters_enabled() const { return adapters_enabled_; }
  // Summed loss over this rank's batch, no autograd (with `token_stats`, LossSum's token sums).
  LossSum eval_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk,
                    const at::Tensor& doc_ids = at::Tensor(), bool token_stats = false);
  // Logits [B*T, vocab] in float32, no autograd (tests, inspection: materialises them all).
  at::Tensor logits(const at::Tensor& inputs);
  // Decoding: logits [B, vocab] (float32) of the last of `inputs` [B, T], the new tokens after
  // the cache's positions, which it appends to the cache (cache.length += T). No autograd.
  at::Tensor next_logits(const at::Tensor& inputs, KvCache& cache);

  // The units of one role, one per piece (plan().units(role)); empty where the plan has none.
  const std::vector<FlatUnit>& units(UnitRole role) const { return units_[role_index(role)]; }
  const FlatUnit& unit(UnitKey key) const;
  // What the optimizer steps and checkpoints save: the adapters with LoRA, else the base units.
  // Index i of on_grad_ready refers to trained_units()[i].
  const std::vector<FlatUnit>& trained_units() const { return units(plan_.trained_role()); }
  // NF4 base: the double-quantization offset of projection p of block `piece`, which is not
  // among the unit's bytes (set when the block is quantized or loaded, parallel/weights.h).
  void set_nf4_offset(size_t piece, Proj p, float offset);
  // NF4 base: bytes of the quantized weights this rank holds (its shards).
  int64_t nf4_bytes() const;
  // NF4 base: projection p of block `piece` (each HF module quantized on its own), or null.
  // Its tensors view the block's gathered bytes: readable while the block is gathered, which
  // at world size 1 is always (the shard is used in place).
  const nf4::Quantized* nf4_weight(size_t piece, Proj p) const;
  Collectives& comm() const { return *comm_; }
  void zero_grad();
  const LlamaShape& shape() const { return plan_.shape; }
  const PrecisionPolicy& policy() const { return policy_; }
  const FsdpOptions& options() const { return options_; }
  const LoraOptions& lora() const { return plan_.options.lora; }
  const QuantOptions& quant() const { return plan_.options.quant; }
  const at::Device& device() const { return device_; }

  // Gathers one unit's full flat weights (compute dtype), connected to its shard by autograd.
  at::Tensor gather(UnitKey key);
  void release(UnitKey key);                // frees the gathered storage (reshard)
  const RopeTables& rope(int64_t seq_len);  // float32 tables for positions [0, seq_len), on the device
  // When set, each unit's reduced shard gradient is handed here the moment it exists (inside
  // backward) instead of being accumulated into shard.grad(): optimizer-in-backward.
  std::function<void(size_t trained_unit, const at::Tensor& shard_grad)> on_grad_ready;
  // Completes the reduce-scatter in flight, if any, delivering its gradient, and frees frozen
  // (LoRA) units still gathered. Backward calls it by itself when the embedding's gradient
  // (the last) is reduced; under LoRA the embedding is frozen, and the step calls it.
  void finish_backward();
  // Most gathered units whose storage was alive at once since construction (memory truth for
  // the prefetch schedule; 0 when gathers alias the shards).
  int64_t peak_gathered_units() const { return peak_gathered_; }
  // The activation offloader (memory.activation_offloading), or null.
  ActivationOffloader* offloader() { return offloader_.get(); }

 private:
  static size_t role_index(UnitRole role) { return static_cast<size_t>(role); }
  // The autograd functions of the schedule (fsdp_forward.cpp): they drive the methods below.
  class GatherUnit;
  class OnBackward;
  class CheckpointedBlock;
  FlatUnit& at(UnitKey key);
  // The piece has a unit of this role with weights (the embedding has no adapter, only blocks
  // have NF4 bytes).
  bool has(UnitKey key) const;
  void regather(size_t piece);  // refills block `piece`'s freed storage before its backward
  // All-gathers the unit into its (re)allocated buffer, no autograd; returns [numel] view.
  at::Tensor fill(UnitKey key);
  // Starts reduce-scattering (mean) a unit's flat gradient [numel] and frees the gathered
  // buffer; the shard gradient (master dtype) is delivered — accumulated into shard.grad(), or
  // handed to on_grad_ready — when the collective completes. Returns an undefined tensor:
  // autograd accumulates nothing itself.
  at::Tensor reduce_grad(UnitKey key, const at::Tensor& grad);
  // World size 1 with the shard already in the compute dtype: gathered weights are the shard
  // itself.
  bool aliases_shard(UnitKey key) const;
  // Starts gathering a unit ahead of its use (no-op when prefetch is off, the piece is out of
  // range, the unit already gathered or in flight); fill() completes it.
  void prefetch(UnitKey key);
  // A block is up to three units: its base unit, its NF4 byte unit (NF4 base) and its adapter
  // unit (LoRA); they are gathered, prefetched and released together. fill_block gathers them and
  // returns the trained buffer (the adapter's with LoRA); compute_block() runs the block on the
  // gathered buffers, with `trained` (when defined) in place of the trained one (the recompute
  // restores the RNG state of the forward, so LoRA dropout draws the same masks);
  // reduce_block_grad reduce-scatters the trained unit's gradient and frees the block.
  at::Tensor fill_block(size_t piece);
  void prefetch_block(size_t piece);
  void release_block(size_t piece);
  // LoRA: frees block `piece`'s frozen units (base, NF4 bytes) once its backward is done.
  void release_frozen(size_t piece);
  at::Tensor compute_block(size_t piece, const at::Tensor& x, const at::Tensor& trained = at::Tensor());
  // Block `piece`'s weights on its gathered flat buffer `flat` (dense or NF4), and its LoRA
  // adapter on the adapter's `flat`.
  BlockWeights block_weights(size_t piece, const at::Tensor& flat) const;
  BlockLora block_lora(size_t piece, const at::Tensor& flat, bool training) const;
  UnitKey head_unit(UnitRole role) const { return {role, units(UnitRole::base).size() - 1}; }
  at::Tensor reduce_block_grad(size_t piece, const at::Tensor& grad);
  void deliver(UnitKey key, const at::Tensor& shard_grad);  // to on_grad_ready or into .grad()
  void complete_reduce();  // waits for the reduce-scatter in flight, if any, and delivers it
  struct PendingReduce {
    UnitKey key;
    at::Tensor shard_grad, input;
    std::unique_ptr<PendingCollective> op;
  };
  // WeightSource: the forward schedule (fsdp_forward.cpp).
  at::Tensor embedding() override;
  void embedding_done() override;
  at::Tensor block(int64_t layer, const at::Tensor& x, const RopeTables& rope) override;
  HeadWeights head() override;
  const OutputAdapter* output_adapter() override;
  void head_done() override;
  bool training_ = false;  // this forward builds a graph for backward
  bool adapters_enabled_ = true;
  bool head_backward_ = false;  // this forward's head backward needs its weights (token_logprobs)
  at::Tensor wte_;              // the embedding table, while a forward runs (tied head)
  OutputAdapter out_adapter_;   // the output adapter's gathered views, while a forward runs

  ModelPlan plan_;
  PrecisionPolicy policy_;
  at::Device device_;
  std::shared_ptr<Collectives> comm_;
  FsdpOptions options_;
  // Per role, per piece: the plan's units, sharded; and the prefetch in flight for each.
  std::array<std::vector<FlatUnit>, kUnitRoles> units_;
  std::array<std::vector<std::unique_ptr<PendingCollective>>, kUnitRoles> gathering_;
  // NF4 base: per piece (blocks only) q/k/v, o, gate/up, down, viewing the NF4 unit's gathered
  // bytes (rebound at each fill); the autograd graph refers to them by address, so they never
  // move.
  std::vector<std::vector<std::unique_ptr<nf4::Quantized>>> nf4_;
  // The NF4 modules of each matrix group of block `piece` (q/k/v, o, gate/up, down).
  std::array<std::vector<const nf4::Quantized*>, kMatrixGroups> nf4_weights(size_t piece) const;
  void bind_nf4(size_t piece);  // points nf4_[piece] at the gathered bytes
  void fill_nf4(size_t piece);  // gathers block `piece`'s NF4 bytes (if any) and binds them
  // The units of block `piece` other than its base unit: NF4 bytes, adapter (where present).
  std::vector<UnitKey> companions(size_t piece) const;
  std::unique_ptr<PendingReduce> reducing_;
  int64_t peak_gathered_ = 0;
  void allocate_gathered(UnitKey key);
  // Casts the shard into its slot of the gathered buffer and starts the in-place all-gather.
  std::unique_ptr<PendingCollective> start_gather(UnitKey key);
  at::Tensor gathered_view(UnitKey key);  // the unit's full flat weights: the gathered buffer, or the shard in place
  RopeTables rope_;
  int64_t rope_len_ = 0;
  std::unique_ptr<ActivationOffloader> offloader_;
  RopeTables batch_rope_;  // the tables (and packing) of the forward in progress, for recomputed blocks
  const RopeTables& batch_rope(const at::Tensor& inputs, const at::Tensor& doc_ids);
};

}  // namespace ptrain
