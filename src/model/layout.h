// Where each Llama parameter lives inside its unit's flat buffer. Units are the FSDP
// granularity: [embedding] [block 0] ... [block L-1] [final norm + output].
// Within a unit, decayed matrices come first and norm weights last, so the weight-decay
// region is the prefix [0, decay_numel). q/k/v rows are adjacent (one fused QKV matmul) and
// so are gate/up rows.
//
// Every tensor group — q/k/v, o, gate/up, down, each norm, the embedding, the output — starts
// at a multiple of kUnitAlign elements (zero padding after a group whose size is not one; real
// Llama shapes need none), and shards are multiples of kUnitAlign too. So every 256-element
// block of a group lies on exactly one rank at every world size: what blockwise 8-bit
// optimizer state needs to be sharded, checkpointed and resharded exactly.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "model/options.h"
#include "model/shape.h"

namespace ptrain {

constexpr int64_t kUnitAlign = 256;

// Unit order: [embedding] [block 0] ... [block L-1] [final norm + output (the head)].
constexpr size_t kEmbeddingUnit = 0;
constexpr size_t block_unit(int64_t layer) { return static_cast<size_t>(layer) + 1; }
constexpr size_t kFirstBlockUnit = block_unit(0);

// A block's four matrix groups in layout order: fused q/k/v rows, o, fused gate/up rows, down.
enum class MatrixGroup : int { qkv, o, gate_up, down };
constexpr int kMatrixGroups = 4;
// A block's seven projections, in lora_targets() order.
enum class Proj : int { q, k, v, o, gate, up, down };
constexpr int kProjections = 7;

enum class SlotInit {
  by_std,           // N(0, init_std), or ones when init_std == 0 (norm weights)
  kaiming_uniform,  // LoRA A: U(-1/sqrt(in), 1/sqrt(in)) (PEFT's init)
  zeros,            // LoRA B
};

struct ParamSlot {
  std::string name;  // Hugging Face tensor name, e.g. model.layers.0.self_attn.q_proj.weight
  std::vector<int64_t> shape;
  int64_t offset = 0;  // into the unit's flat buffer (elements)
  int64_t numel = 0;
  bool decay = false;     // weight decay applies (matrices)
  double init_std = 0.0;  // 0 -> initialised to ones (norm weights)
  SlotInit init = SlotInit::by_std;
};

enum class UnitKind { embedding, block, head };

struct UnitLayout {
  std::string name;  // "embed", "block.3", "head"
  UnitKind kind = UnitKind::block;
  int64_t layer = -1;  // block index
  std::vector<ParamSlot> slots;
  int64_t numel = 0;
  int64_t decay_numel = 0;            // decayed prefix length (a multiple of kUnitAlign)
  std::vector<int64_t> group_begins;  // offsets of the aligned tensor groups, ascending
  // Offset of the slot whose name ends with `suffix` (e.g. "self_attn.q_proj.weight").
  int64_t offset_of(const std::string& suffix) const;
};

// Elements of a unit each rank holds at `world_size`: ceil(numel / world_size) rounded up to
// kUnitAlign. The last ranks' shards end in zero padding.
int64_t shard_numel(int64_t unit_numel, int64_t world_size);

// All units in forward order. `init_std` is the base std of matrix init (output projections
// of each block get init_std / sqrt(2 * n_layers)).
std::vector<UnitLayout> llama_units(const LlamaShape& shape, double init_std);
// The same units with the four matrix groups of every block (q/k/v, o, gate/up, down) left out:
// an NF4 base keeps those quantized beside the units, and only the norms (and the family's
// biases and q/k norms) stay in the blocks, grouped as in the full layout.
std::vector<UnitLayout> llama_units_without_block_matrices(const LlamaShape& shape, double init_std);
// The slots of each aligned tensor group of a unit, in layout order.
std::vector<std::vector<ParamSlot>> slot_groups(const UnitLayout& unit);
// Block matrix groups in MatrixGroup order: q/k/v, o, gate/up, down; each the slots it fuses.
std::vector<std::vector<ParamSlot>> block_matrix_groups(const UnitLayout& block);

// LoRA adapters, one layout per base unit (same order; "<unit>.lora"): for each targeted
// projection of a block (q, k, v, o, gate, up, down) an A [rank, in] and a B [out, rank]
// slot named as PEFT names them ("model.layers.N.self_attn.q_proj.lora_A.weight"), each its own
// aligned group; with the target "output" the head unit gets lm_head.lora_A/B ([rank, dim],
// [vocab, rank]). The embedding unit's layout is empty.
std::vector<UnitLayout> lora_units(const LlamaShape& shape, const std::vector<std::string>& targets, int64_t rank);
// Every projection LoRA can adapt, in block order then the output: the name lora.targets uses
// ("q" ... "down", "output") and the Hugging Face module path ("self_attn.q_proj" ..., "lm_head"),
// whose last part is the name PEFT's target_modules uses. The one table of LoRA targets.
struct LoraTarget {
  const char* name;
  const char* module;
};
const std::vector<LoraTarget>& lora_targets();
// The HF module path's last part ("q_proj", "lm_head") of a target; "" when unknown, and back.
std::string peft_module(const std::string& target);
std::string target_of_peft_module(const std::string& module);

// The factor an adapter's B·A is scaled by: alpha / rank, or alpha / sqrt(rank) with rsLoRA.
double lora_scale(const LoraOptions& lora);

// The projection names in block order and their (in, out) sizes.
struct Projection {
  std::string target;  // q, k, v, o, gate, up, down
  std::string module;  // self_attn.q_proj, ...
  int64_t in = 0, out = 0;
};
std::vector<Projection> block_projections(const LlamaShape& shape);

}  // namespace ptrain
