// The model plan: every tensor a run holds, decided once from the model's shape and the run's
// options. It lists the units the sharding engine shards — the base units (embedding, each block,
// final norm + output), LoRA adapter units beside them, NF4 byte units holding each block's
// quantized matrices — with each unit's layout (tensor names, shapes, offsets), the dtype its
// shards are stored in, the dtype it is gathered in, and whether it is trained.
//
// FsdpModel allocates exactly these units; the memory planner (`ptrain check`), the loaders and
// export read the same plan, so a new kind of tensor is one edit here and the predicted bytes
// cannot disagree with the allocated ones.
#pragma once
#include <c10/core/ScalarType.h>

#include <cstdint>
#include <string>
#include <vector>

#include "model/layout.h"
#include "model/options.h"
#include "model/shape.h"

namespace ptrain {

struct PlanOptions {
  double init_std = 0.0;                        // model.init_std (the layouts' init stds)
  c10::ScalarType master_dtype = c10::kFloat;   // trained parameters' shards
  c10::ScalarType compute_dtype = c10::kFloat;  // gathered weights; a frozen base's shards
  LoraOptions lora;                             // enabled: frozen base + trained adapters
  QuantOptions quant;                           // nf4 (with LoRA): blocks' matrices in NF4
};

enum class UnitRole { base, adapter, nf4 };
constexpr size_t kUnitRoles = 3;

// One unit of a plan: its role and its piece (0 the embedding, block_unit(layer) a block, the
// last the final norm + output; model/layout.h). A piece has one unit of each role the plan holds.
struct UnitKey {
  UnitRole role = UnitRole::base;
  size_t piece = 0;
  friend bool operator==(const UnitKey&, const UnitKey&) = default;
};

struct PlannedUnit {
  UnitLayout layout;  // numel 0 where a piece has no such unit (the embedding's adapters)
  UnitRole role = UnitRole::base;
  c10::ScalarType stored = c10::kFloat;    // dtype of every rank's shard
  c10::ScalarType gathered = c10::kFloat;  // dtype of the all-gathered buffer
  bool trained = false;                    // has gradients and optimizer state
};

struct ModelPlan {
  LlamaShape shape;
  PlanOptions options;
  // Every base tensor, the blocks' matrices included, one layout per piece (embedding, blocks,
  // head): what the seeded init draws, a checkpoint holds and export writes.
  std::vector<UnitLayout> full;
  // Per piece, in the same order: the base unit (without the matrices under NF4), and — with
  // LoRA / an NF4 base — its adapter unit and NF4 byte unit (empty outside the blocks).
  std::vector<PlannedUnit> base, adapters, nf4;

  static ModelPlan make(const LlamaShape& shape, const PlanOptions& options);
  // The units of one role: base, adapters or nf4 (empty where the run has none of that role).
  const std::vector<PlannedUnit>& units(UnitRole role) const;
  // The role the optimizer steps: the adapters with LoRA, else the base.
  UnitRole trained_role() const { return options.lora.enabled ? UnitRole::adapter : UnitRole::base; }
  const std::vector<PlannedUnit>& trained() const { return units(trained_role()); }
  int64_t num_params() const;  // the model's parameters (full layouts)
  int64_t nf4_params() const;  // of them, held in 4 bits
};

// The byte unit an NF4 base keeps beside block `block` (a full block layout): one slot per
// projection (Proj order: each HF module quantized on its own, as bitsandbytes quantizes a
// Linear4bit) named "<layer prefix>.nf4.<module>" ("model.layers.0.nf4.q_proj"), holding its
// packed codes and scales as nf4::byte_layout lays them out.
UnitLayout nf4_unit_layout(const UnitLayout& block, bool double_quant);

}  // namespace ptrain
