#include "model/layout.h"

#include <cmath>

namespace ptrain {

namespace {
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

std::vector<UnitLayout> llama_units(const LlamaShape& s, double init_std) {
  std::vector<UnitLayout> units;
  UnitLayout embed;
  embed.name = "embed";
  embed.kind = UnitKind::embedding;
  add(embed, "model.embed_tokens.weight", {s.vocab_size, s.dim}, true, init_std);
  units.push_back(embed);

  const double out_std = init_std / std::sqrt(2.0 * static_cast<double>(s.n_layers));
  for (int64_t i = 0; i < s.n_layers; ++i) {
    UnitLayout b;
    b.name = "block." + std::to_string(i);
    b.kind = UnitKind::block;
    b.layer = i;
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(b, p + "self_attn.q_proj.weight", {s.q_dim(), s.dim}, true, init_std);
    add(b, p + "self_attn.k_proj.weight", {s.kv_dim(), s.dim}, true, init_std);
    add(b, p + "self_attn.v_proj.weight", {s.kv_dim(), s.dim}, true, init_std);
    add(b, p + "self_attn.o_proj.weight", {s.dim, s.q_dim()}, true, out_std);
    add(b, p + "mlp.gate_proj.weight", {s.ffn_dim, s.dim}, true, init_std);
    add(b, p + "mlp.up_proj.weight", {s.ffn_dim, s.dim}, true, init_std);
    add(b, p + "mlp.down_proj.weight", {s.dim, s.ffn_dim}, true, out_std);
    add(b, p + "input_layernorm.weight", {s.dim}, false, 0.0);
    add(b, p + "post_attention_layernorm.weight", {s.dim}, false, 0.0);
    units.push_back(b);
  }

  UnitLayout head;
  head.name = "head";
  head.kind = UnitKind::head;
  if (!s.tie_embeddings) add(head, "lm_head.weight", {s.vocab_size, s.dim}, true, init_std);
  add(head, "model.norm.weight", {s.dim}, false, 0.0);
  units.push_back(head);
  return units;
}

}  // namespace ptrain
