#include "parallel/weights.h"

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <ATen/core/Generator.h>

#include <algorithm>
#include <cmath>
#include <set>

#include "common/error.h"
#include "common/hash.h"
#include "parallel/fsdp.h"

namespace ptrain {

namespace {

// Decorrelated generator seeds per unit.
uint64_t mix_seed(uint64_t seed, uint64_t stream) { return mix64(seed + kGolden64 * (stream + 1)); }

// Copies the part of `slot` that lies in this rank's shard of `u` from `src` (the whole tensor,
// any shape); the rest of `src` is never read.
void copy_rank_slice(const FlatUnit& u, const ParamSlot& slot, const at::Tensor& src) {
  const int64_t a = std::max(u.shard_offset, slot.offset),
                b = std::min(u.shard_offset + u.owned(), slot.offset + slot.numel);
  if (a < b)
    u.shard.detach().narrow(0, a - u.shard_offset, b - a).copy_(src.reshape({-1}).narrow(0, a - slot.offset, b - a));
}

// Elements drawn from one generator: a slot's piece k (of kInitPiece elements) has its own.
constexpr int64_t kInitPiece = int64_t{1} << 20;

// Draws the whole unit (one unit at a time) so every world size gets the same numbers; keeps
// this rank's slice. Each slot is drawn in pieces of kInitPiece elements, piece k of slot s from
// a generator of its own (the unit's seed mixed with s and k), the pieces in parallel: the same
// numbers at any world size and thread count, and no longer one generator's serial stream (an
// 8B model's 8e9 normal draws took ~190 s on 2 cores, ~200 s on a 16-core GPU machine).
void init_unit(const FlatUnit& u, uint64_t seed) {
  // Drawn in place where the shard is the whole unit on the CPU (one rank; the full unit a QLoRA
  // block is quantized from), else into a whole-unit buffer this rank's slice is copied from.
  const bool whole = u.shard_offset == 0 && u.owned() == u.layout.numel && u.shard.device().is_cpu() &&
                     u.shard.scalar_type() == at::kFloat && u.shard.is_contiguous();
  at::Tensor flat = whole ? u.shard.detach() : at::empty({u.layout.numel}, at::kFloat);
  flat.zero_();  // alignment padding stays 0
  struct Piece {
    size_t slot;
    int64_t index;
  };
  std::vector<Piece> pieces;
  for (size_t s = 0; s < u.layout.slots.size(); ++s)
    for (int64_t k = 0; k * kInitPiece < u.layout.slots[s].numel; ++k) pieces.push_back({s, k});
  at::parallel_for(0, static_cast<int64_t>(pieces.size()), 1, [&](int64_t p0, int64_t p1) {
    for (int64_t p = p0; p < p1; ++p) {
      const ParamSlot& slot = u.layout.slots[pieces[p].slot];
      const int64_t begin = pieces[p].index * kInitPiece;
      at::Tensor part = flat.narrow(0, slot.offset + begin, std::min(kInitPiece, slot.numel - begin));
      at::Generator gen = at::make_generator<at::CPUGeneratorImpl>(
          mix_seed(seed, (static_cast<uint64_t>(pieces[p].slot) << 32) | static_cast<uint64_t>(pieces[p].index)));
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
  });
  if (whole) return;
  u.shard.zero_();
  if (u.owned() > 0) u.shard.narrow(0, 0, u.owned()).copy_(flat.narrow(0, u.shard_offset, u.owned()));
}

// Stores block `unit`'s seven quantized projections (Proj order) in its NF4 unit: this rank's
// bytes, and every module's double-quantization offset.
void store_nf4_block(FsdpModel& model, size_t unit, const std::vector<nf4::Quantized>& modules) {
  TORCH_CHECK(static_cast<int>(modules.size()) == kProjections, "a block has 7 projections");
  const bool double_quant = model.quant().double_quant;
  const FlatUnit& u = model.unit({UnitRole::nf4, unit});
  u.shard.zero_();
  for (size_t p = 0; p < modules.size(); ++p) {
    const nf4::Quantized& q = modules[p];
    TORCH_CHECK(q.double_quant == double_quant, "NF4 module ", p, " of block ", unit, " is ",
                q.double_quant ? "" : "not ", "double-quantized, unlike quant.double_quant");
    const ParamSlot& slot = u.layout.slots[p];
    at::Tensor bytes = at::empty({slot.numel}, at::kByte);
    nf4::write_bytes(q, bytes);
    copy_rank_slice(u, slot, bytes);
    model.set_nf4_offset(unit, static_cast<Proj>(p), q.offset);
  }
}

// Every rank quantizes each whole module (double quantization's scales span it) and keeps the
// bytes that fall in its shard.
void quantize_block(FsdpModel& model, size_t unit, const std::vector<at::Tensor>& modules) {
  std::vector<nf4::Quantized> quantized;
  for (const auto& m : modules) quantized.push_back(nf4::quantize(m, model.quant().double_quant));  // on the CPU
  store_nf4_block(model, unit, quantized);
}

void check_shape(const std::string& name, const at::Tensor& src, const std::vector<int64_t>& shape) {
  if (src.sizes().vec() != shape)
    throw RuntimeError("HF tensor '" + name + "' has shape " + c10::str(src.sizes()) + ", the model expects " +
                       c10::str(c10::IntArrayRef(shape)));
}

}  // namespace

void init_weights(FsdpModel& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  const ModelPlan& plan = model.plan();
  const std::vector<FlatUnit>& units = model.units(UnitRole::base);
  for (size_t i = 0; i < units.size(); ++i) {
    if (!plan.options.quant.nf4() || units[i].layout.kind != UnitKind::block) {
      init_unit(units[i], mix_seed(seed, i));
      continue;
    }
    // The same numbers a dense model draws (the full unit), then the matrices are quantized.
    FlatUnit full;
    full.layout = plan.full[i];
    full.shard_numel = full.layout.numel;
    full.shard = at::empty({full.layout.numel}, at::kFloat);
    init_unit(full, mix_seed(seed, i));
    std::vector<at::Tensor> modules;
    for (const auto& g : block_matrix_groups(full.layout))
      for (const auto& slot : g) modules.push_back(slot_view(full.shard, slot));
    quantize_block(model, i, modules);
    const FlatUnit& u = units[i];
    u.shard.zero_();
    for (const auto& slot : u.layout.slots)  // the norms
      copy_rank_slice(u, slot, full.shard.narrow(0, full.layout.offset_of(slot.name), slot.numel));
  }
  init_adapters(model, seed);
}

void init_adapters(FsdpModel& model, uint64_t seed) {
  at::NoGradGuard no_grad;
  const std::vector<FlatUnit>& adapters = model.units(UnitRole::adapter);
  for (size_t i = 0; i < adapters.size(); ++i) init_unit(adapters[i], mix_seed(seed ^ 0x4C6F5241ull, i));
}

void load_weights(FsdpModel& model, const TensorByName& tensor, const Nf4ByName& quantized) {
  at::NoGradGuard no_grad;
  const ModelPlan& plan = model.plan();
  const bool nf4_base = plan.options.quant.nf4();
  TORCH_CHECK(!quantized || nf4_base, "a pre-quantized checkpoint loads into an NF4 base only");
  const std::vector<FlatUnit>& units = model.units(UnitRole::base);
  if (nf4_base) {
    // One module at a time: read from the memory-mapped files (a view: no copy), quantized, and
    // dropped; the full-precision model never exists in memory. Pre-quantized modules are
    // copied as stored.
    for (size_t i = 0; i < units.size(); ++i) {
      if (units[i].layout.kind != UnitKind::block) continue;
      if (quantized) {
        std::vector<nf4::Quantized> modules;
        for (const auto& g : block_matrix_groups(plan.full[i]))
          for (const auto& slot : g) modules.push_back(quantized(slot.name, slot.shape));
        store_nf4_block(model, i, modules);
        continue;
      }
      std::vector<at::Tensor> modules;
      for (const auto& g : block_matrix_groups(plan.full[i]))
        for (const auto& slot : g) {
          at::Tensor src = tensor(slot.name);
          check_shape(slot.name, src, slot.shape);
          modules.push_back(src);
        }
      quantize_block(model, i, modules);
    }
  }
  for (const auto& u : units) {
    u.shard.zero_();
    for (const auto& slot : u.layout.slots) {
      at::Tensor src = tensor(slot.name);  // a view of the mapped file: only the slice copied is read
      check_shape(slot.name, src, slot.shape);
      copy_rank_slice(u, slot, src);
    }
  }
}

void load_adapters(FsdpModel& model, const std::map<std::string, at::Tensor>& tensors) {
  at::NoGradGuard no_grad;
  std::set<std::string> used;
  for (const auto& u : model.units(UnitRole::adapter)) {
    u.shard.detach().zero_();
    for (const auto& slot : u.layout.slots) {
      auto it = tensors.find(slot.name);
      if (it == tensors.end())
        throw RuntimeError("the adapter has no tensor '" + slot.name + "'; its targets differ from lora.targets");
      used.insert(slot.name);
      if (it->second.sizes().vec() != slot.shape)
        throw RuntimeError("adapter tensor '" + slot.name + "' has shape " + c10::str(it->second.sizes()) +
                           ", lora.rank and the model give " + c10::str(c10::IntArrayRef(slot.shape)));
      copy_rank_slice(u, slot, it->second);
    }
  }
  for (const auto& [name, t] : tensors)
    if (!used.count(name))
      throw RuntimeError("the adapter holds " + std::to_string(tensors.size() - used.size()) +
                         " tensor(s) ptrain would not use, e.g. '" + name +
                         "' (a projection lora.targets does not list, or a kind of tensor ptrain does not train)");
}

}  // namespace ptrain
