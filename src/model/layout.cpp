#include "model/layout.h"

#include <algorithm>
#include <cmath>
#include <stdexcept>

namespace ptrain {

namespace {
// Starts a tensor group: pads the unit to the next multiple of kUnitAlign first.
void group(UnitLayout& u) {
  u.numel = (u.numel + kUnitAlign - 1) / kUnitAlign * kUnitAlign;
  if (!u.slots.empty() && u.slots.back().decay) u.decay_numel = u.numel;
  u.group_begins.push_back(u.numel);
}

void add(UnitLayout& u, std::string name, std::vector<int64_t> shape, bool decay, double std) {
  ParamSlot s;
  s.name = std::move(name);
  s.shape = std::move(shape);
  s.numel = 1;
  for (int64_t d : s.shape) s.numel *= d;
  s.offset = u.numel;
  s.decay = decay;
  s.init_std = std;
  u.numel += s.numel;
  if (decay) u.decay_numel = u.numel;
  u.slots.push_back(std::move(s));
}
}  // namespace

namespace {
// A bias or norm slot: no weight decay; biases start at zero, norm weights at one.
void add_vector(UnitLayout& u, std::string name, int64_t size, SlotInit init) {
  add(u, std::move(name), {size}, false, 0.0);
  u.slots.back().init = init;
}

// One block: the four matrix groups (decayed), then the norms and the family's biases and q/k
// norms, each group aligned. Fused groups keep their tensors adjacent (q/k/v rows and biases,
// gate/up rows and biases) so the forward reads each as one tensor.
UnitLayout block_unit(const LlamaShape& s, int64_t layer, double init_std, bool matrices) {
  const double out_std = init_std / std::sqrt(2.0 * static_cast<double>(s.n_layers));
  UnitLayout b;
  b.name = "block." + std::to_string(layer);
  b.kind = UnitKind::block;
  b.layer = layer;
  const std::string p = "model.layers." + std::to_string(layer) + ".";
  if (matrices) {
    group(b);
    add(b, p + "self_attn.q_proj.weight", {s.q_dim(), s.dim}, true, init_std);
    add(b, p + "self_attn.k_proj.weight", {s.kv_dim(), s.dim}, true, init_std);
    add(b, p + "self_attn.v_proj.weight", {s.kv_dim(), s.dim}, true, init_std);
    group(b);
    add(b, p + "self_attn.o_proj.weight", {s.dim, s.q_dim()}, true, out_std);
    group(b);
    add(b, p + "mlp.gate_proj.weight", {s.ffn_dim, s.dim}, true, init_std);
    add(b, p + "mlp.up_proj.weight", {s.ffn_dim, s.dim}, true, init_std);
    group(b);
    add(b, p + "mlp.down_proj.weight", {s.dim, s.ffn_dim}, true, out_std);
  }
  group(b);
  add_vector(b, p + "input_layernorm.weight", s.dim, SlotInit::by_std);
  group(b);
  add_vector(b, p + "post_attention_layernorm.weight", s.dim, SlotInit::by_std);
  if (s.qkv_bias()) {
    group(b);
    add_vector(b, p + "self_attn.q_proj.bias", s.q_dim(), SlotInit::zeros);
    add_vector(b, p + "self_attn.k_proj.bias", s.kv_dim(), SlotInit::zeros);
    add_vector(b, p + "self_attn.v_proj.bias", s.kv_dim(), SlotInit::zeros);
  }
  if (s.o_bias()) {
    group(b);
    add_vector(b, p + "self_attn.o_proj.bias", s.dim, SlotInit::zeros);
  }
  if (s.mlp_biased()) {
    group(b);
    add_vector(b, p + "mlp.gate_proj.bias", s.ffn_dim, SlotInit::zeros);
    add_vector(b, p + "mlp.up_proj.bias", s.ffn_dim, SlotInit::zeros);
    group(b);
    add_vector(b, p + "mlp.down_proj.bias", s.dim, SlotInit::zeros);
  }
  if (s.qk_norm()) {
    group(b);
    add_vector(b, p + "self_attn.q_norm.weight", s.head_dim, SlotInit::by_std);
    group(b);
    add_vector(b, p + "self_attn.k_norm.weight", s.head_dim, SlotInit::by_std);
  }
  group(b);
  b.group_begins.pop_back();  // the final call only pads
  return b;
}

std::vector<UnitLayout> units(const LlamaShape& s, double init_std, bool block_matrices) {
  std::vector<UnitLayout> units;
  UnitLayout embed;
  embed.name = "embed";
  embed.kind = UnitKind::embedding;
  group(embed);
  add(embed, "model.embed_tokens.weight", {s.vocab_size, s.dim}, true, init_std);
  group(embed);
  embed.group_begins.pop_back();
  units.push_back(embed);

  for (int64_t i = 0; i < s.n_layers; ++i) units.push_back(block_unit(s, i, init_std, block_matrices));

  UnitLayout head;
  head.name = "head";
  head.kind = UnitKind::head;
  if (!s.tie_embeddings) {
    group(head);
    add(head, "lm_head.weight", {s.vocab_size, s.dim}, true, init_std);
  }
  group(head);
  add(head, "model.norm.weight", {s.dim}, false, 0.0);
  group(head);
  head.group_begins.pop_back();
  units.push_back(head);
  return units;
}
}  // namespace

std::vector<UnitLayout> llama_units(const LlamaShape& s, double init_std) { return units(s, init_std, true); }

std::vector<UnitLayout> llama_units_without_block_matrices(const LlamaShape& s, double init_std) {
  return units(s, init_std, false);
}

std::vector<std::vector<ParamSlot>> slot_groups(const UnitLayout& unit) {
  std::vector<std::vector<ParamSlot>> groups;
  for (size_t g = 0; g < unit.group_begins.size(); ++g) {
    const int64_t begin = unit.group_begins[g];
    const int64_t end = g + 1 < unit.group_begins.size() ? unit.group_begins[g + 1] : unit.numel;
    std::vector<ParamSlot> slots;
    for (const auto& s : unit.slots)
      if (s.offset >= begin && s.offset < end) slots.push_back(s);
    if (!slots.empty()) groups.push_back(std::move(slots));
  }
  return groups;
}

std::vector<std::vector<ParamSlot>> block_matrix_groups(const UnitLayout& block) {
  std::vector<std::vector<ParamSlot>> groups;
  for (auto& g : slot_groups(block))
    if (g.front().shape.size() == 2) groups.push_back(std::move(g));
  return groups;
}

const std::vector<LoraTarget>& lora_targets() {
  static const std::vector<LoraTarget> kTargets{
      {"q", "self_attn.q_proj"}, {"k", "self_attn.k_proj"}, {"v", "self_attn.v_proj"}, {"o", "self_attn.o_proj"},
      {"gate", "mlp.gate_proj"}, {"up", "mlp.up_proj"},     {"down", "mlp.down_proj"}, {"output", "lm_head"}};
  return kTargets;
}

namespace {
std::string last_part(const std::string& module) { return module.substr(module.rfind('.') + 1); }
}  // namespace

std::string peft_module(const std::string& target) {
  for (const auto& t : lora_targets())
    if (target == t.name) return last_part(t.module);
  return "";
}

double lora_scale(const LoraOptions& lora) {
  const double r = static_cast<double>(lora.rank);
  return lora.alpha / (lora.rslora ? std::sqrt(r) : r);
}

std::string target_of_peft_module(const std::string& module) {
  for (const auto& t : lora_targets())
    if (module == last_part(t.module)) return t.name;
  return "";
}

std::vector<Projection> block_projections(const LlamaShape& s) {
  // (in, out) of each block projection, in lora_targets() order (the output is not a block's).
  const std::pair<int64_t, int64_t> sizes[7] = {{s.dim, s.q_dim()}, {s.dim, s.kv_dim()}, {s.dim, s.kv_dim()},
                                                {s.q_dim(), s.dim}, {s.dim, s.ffn_dim},  {s.dim, s.ffn_dim},
                                                {s.ffn_dim, s.dim}};
  std::vector<Projection> out;
  for (size_t i = 0; i < 7; ++i)
    out.push_back({lora_targets()[i].name, lora_targets()[i].module, sizes[i].first, sizes[i].second});
  return out;
}

std::vector<UnitLayout> lora_units(const LlamaShape& s, const std::vector<std::string>& targets, int64_t rank) {
  std::vector<UnitLayout> out;
  for (const auto& base : llama_units(s, 0.02)) {
    UnitLayout u;
    u.name = base.name + ".lora";
    u.kind = base.kind;
    u.layer = base.layer;
    if (base.kind == UnitKind::block) {
      const std::string p = "model.layers." + std::to_string(base.layer) + ".";
      for (const auto& proj : block_projections(s)) {
        if (std::find(targets.begin(), targets.end(), proj.target) == targets.end()) continue;
        group(u);
        add(u, p + proj.module + ".lora_A.weight", {rank, proj.in}, true, 0.0);
        u.slots.back().init = SlotInit::kaiming_uniform;
        group(u);
        add(u, p + proj.module + ".lora_B.weight", {proj.out, rank}, true, 0.0);
        u.slots.back().init = SlotInit::zeros;
      }
      group(u);
      u.group_begins.pop_back();
    } else if (base.kind == UnitKind::head && std::find(targets.begin(), targets.end(), "output") != targets.end()) {
      group(u);
      add(u, "lm_head.lora_A.weight", {rank, s.dim}, true, 0.0);
      u.slots.back().init = SlotInit::kaiming_uniform;
      group(u);
      add(u, "lm_head.lora_B.weight", {s.vocab_size, rank}, true, 0.0);
      u.slots.back().init = SlotInit::zeros;
      group(u);
      u.group_begins.pop_back();
    }
    out.push_back(std::move(u));
  }
  return out;
}

int64_t UnitLayout::offset_of(const std::string& suffix) const {
  for (const auto& s : slots)
    if (s.name.size() >= suffix.size() && s.name.compare(s.name.size() - suffix.size(), suffix.size(), suffix) == 0)
      return s.offset;
  throw std::logic_error("unit " + name + " has no tensor " + suffix);
}

int64_t shard_numel(int64_t unit_numel, int64_t world_size) {
  const int64_t per_rank = (unit_numel + world_size - 1) / world_size;
  return (per_rank + kUnitAlign - 1) / kUnitAlign * kUnitAlign;
}

}  // namespace ptrain
