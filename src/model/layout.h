// Where each Llama parameter lives inside its unit's flat buffer. Units are the FSDP
// granularity: [embedding] [block 0] ... [block L-1] [final norm + output].
// Within a unit, decayed matrices come first and norm weights last, so the weight-decay
// region is the prefix [0, decay_numel). q/k/v rows are adjacent (one fused QKV matmul) and
// so are gate/up rows.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/shape.h"

namespace ptrain {

struct ParamSlot {
  std::string name;            // Hugging Face tensor name, e.g. model.layers.0.self_attn.q_proj.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;          // into the unit's flat buffer (elements)
  int64_t numel = 0;
  bool decay = false;          // weight decay applies (matrices)
  double init_std = 0.0;       // 0 -> initialised to ones (norm weights)
};

enum class UnitKind { embedding, block, head };

struct UnitLayout {
  std::string name;            // "embed", "block.3", "head"
  UnitKind kind = UnitKind::block;
  int64_t layer = -1;          // block index
  std::vector<ParamSlot> slots;
  int64_t numel = 0;
  int64_t decay_numel = 0;     // decayed prefix length
};

// All units in forward order. `init_std` is the base std of matrix init (output projections
// of each block get init_std / sqrt(2 * n_layers)).
std::vector<UnitLayout> llama_units(const LlamaShape& shape, double init_std);

}  // namespace ptrain
