#include "model/plan.h"

#include <stdexcept>

#include "quant/nf4.h"

namespace ptrain {

UnitLayout nf4_unit_layout(const UnitLayout& block, bool double_quant) {
  UnitLayout l;
  l.name = block.name + ".nf4";
  l.kind = UnitKind::block;
  l.layer = block.layer;
  for (const auto& group : block_matrix_groups(block))
    for (const auto& module : group) {  // q, k, v, o, gate, up, down: each quantized on its own
      ParamSlot s;
      const std::string stem = module.name.substr(0, module.name.rfind(".weight"));
      s.name = "model.layers." + std::to_string(block.layer) + ".nf4." + stem.substr(stem.rfind('.') + 1);
      s.numel = nf4::byte_layout(module.numel, double_quant).bytes;
      s.shape = {s.numel};
      s.offset = l.numel;
      l.group_begins.push_back(s.offset);
      l.numel += s.numel;
      l.slots.push_back(std::move(s));
    }
  if (l.slots.size() != kProjections) throw std::logic_error("a block has 7 projections");
  return l;
}

ModelPlan ModelPlan::make(const LlamaShape& shape, const PlanOptions& o) {
  if (o.quant.nf4() && !o.lora.enabled)
    throw std::invalid_argument("an NF4 base is frozen: it needs LoRA adapters to train");
  ModelPlan p;
  p.shape = shape;
  p.options = o;
  p.full = llama_units(shape, o.init_std);
  // A frozen base needs no master copy: it is stored in the compute dtype.
  const c10::ScalarType base_stored = o.lora.enabled ? o.compute_dtype : o.master_dtype;
  for (auto& layout : o.quant.nf4() ? llama_units_without_block_matrices(shape, o.init_std) : p.full)
    p.base.push_back({std::move(layout), UnitRole::base, base_stored, o.compute_dtype, !o.lora.enabled});
  if (o.lora.enabled)
    for (auto& layout : lora_units(shape, o.lora.targets, o.lora.rank))
      p.adapters.push_back({std::move(layout), UnitRole::adapter, o.master_dtype, o.compute_dtype, true});
  if (o.quant.nf4())
    for (const auto& full : p.full)
      p.nf4.push_back({full.kind == UnitKind::block ? nf4_unit_layout(full, o.quant.double_quant) : UnitLayout{},
                       UnitRole::nf4, c10::kByte, c10::kByte, false});
  return p;
}

const std::vector<PlannedUnit>& ModelPlan::units(UnitRole role) const {
  switch (role) {
    case UnitRole::base:
      return base;
    case UnitRole::adapter:
      return adapters;
    case UnitRole::nf4:
      return nf4;
  }
  throw std::logic_error("unknown unit role");
}

int64_t ModelPlan::num_params() const {
  int64_t n = 0;
  for (const auto& u : full) n += u.numel;
  return n;
}

int64_t ModelPlan::nf4_params() const {
  if (!options.quant.nf4()) return 0;
  int64_t n = 0;
  for (const auto& u : full)
    if (u.kind == UnitKind::block)
      for (const auto& g : block_matrix_groups(u))
        for (const auto& slot : g) n += slot.numel;
  return n;
}

}  // namespace ptrain
