// Llama forward math, one function per piece, over weights given as views of a unit's flat
// buffer (in the compute dtype). Pure model code: no parameters are owned here; sharding
// and gathering happen outside (src/parallel).
#pragma once
#include <ATen/Tensor.h>

#include <array>
#include <vector>

#include "model/layout.h"
#include "model/options.h"
#include "model/shape.h"

namespace ptrain {

namespace nf4 {
struct Quantized;
}

// Decoding state: every layer's keys (after RoPE) and values of the positions so far, in
// buffers of `capacity` positions allocated once. A forward over new tokens with a cache runs
// them at positions [length, length + T), appends their keys and values, and attends over all
// held positions (causally among the new ones).
struct KvCache {
  struct Layer {
    at::Tensor k, v;  // [batch, n_kv_heads, capacity, head_dim]
  };
  std::vector<Layer> layers;
  int64_t length = 0;  // positions held: the next token's position
  int64_t capacity = 0;
  KvCache(const LlamaShape& shape, int64_t batch, int64_t capacity, c10::ScalarType dtype, const at::Device& device);
  int64_t bytes() const;  // of the buffers (all layers, keys and values)
};

// RoPE tables in float32 for positions [0, seq_len): cos/sin of shape [seq_len, head_dim/2],
// with the frequencies scaled (llama3, linear or YaRN, same math as HF) when
// shape.rope_scaling.factor > 0, and YaRN's attention factor multiplied in.
// With the fields below, the attention context of one forward (every block reads it).
struct RopeTables {
  at::Tensor cos;
  at::Tensor sin;
  // Packed sequences (packed_positions): each token's position in its own document [B, T].
  // The additive attention mask [B or 1, 1, T, T] (0: causal, within the same document and the
  // sliding window; -inf elsewhere) of packed rows (packed_positions) or of rows longer than the
  // window (windowed_positions): one tensor every block's attention reads — a boolean mask would
  // be converted, and saved for backward, by each of them.
  // Undefined: positions 0..T-1 and plain causal attention (within the window, if any).
  at::Tensor positions;
  at::Tensor doc_mask;
  at::Tensor token_cos, token_sin;  // packed: cos/sin at each token's position [B, T, 1, head_dim/2]
  // Decoding (cached_positions): the cache the blocks extend; null otherwise.
  KvCache* cache = nullptr;
};
// `tables` for a batch of packed documents: doc_ids [B, T] numbers each token's document
// (consecutive tokens of one document share an id); positions restart at 0 in each document,
// and attention never crosses a document boundary. With a sliding `window` (> 0), a token sees
// only the last `window` positions of its document, itself included. The mask is in
// `mask_dtype` (attention's dtype: the compute dtype).
RopeTables packed_positions(const RopeTables& tables, const at::Tensor& doc_ids,
                            c10::ScalarType mask_dtype = c10::kFloat, int64_t window = 0);
// `tables` for rows of T tokens under a sliding `window`: the additive mask of token i seeing
// positions (i - window, i]. `tables` itself where the window never applies (window 0 or >= T).
RopeTables windowed_positions(const RopeTables& tables, int64_t T, int64_t window,
                              c10::ScalarType mask_dtype = c10::kFloat);
// `tables` for T new tokens after the cache's `length` positions (tables must cover length + T).
RopeTables cached_positions(const RopeTables& tables, KvCache& cache, int64_t T);
at::Tensor rope_inv_freq(const LlamaShape& shape);
RopeTables rope_tables(const LlamaShape& shape, int64_t seq_len, const at::Device& device);

// x: [..., dim]. Normalises in float32, returns weight * x_normed in x's dtype (HF order).
at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps);

// x: [B, T, heads, head_dim]; rotates (first half, second half) pairs in float32, by the
// composite path or the fused function (model/rope.h, kernels.fused_rope).
at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope, bool fused = false);

// Views of one block's flat buffer (in the compute dtype), by matrix group (MatrixGroup).
struct BlockWeights {
  // [q_dim + 2*kv_dim, dim] (q, k, v rows stacked), [dim, q_dim], [2*ffn_dim, dim] (gate rows,
  // then up rows), [dim, ffn_dim]
  at::Tensor matrix[kMatrixGroups];
  // Their biases, stacked the same way; undefined where the family has none.
  at::Tensor bias[kMatrixGroups];
  at::Tensor attn_norm;       // [dim]
  at::Tensor ffn_norm;        // [dim]
  at::Tensor q_norm, k_norm;  // [head_dim] (qwen3), else undefined
  // NF4 base: each matrix group is these frozen 4-bit modules instead, their rows stacked
  // (q, k, v for MatrixGroup::qkv; gate, up for gate_up); empty for a dense base.
  std::vector<const nf4::Quantized*> q4[kMatrixGroups];
  // Every tensor of the block unit's layout (a full llama_units() block, or one without the
  // matrices: then q4 holds the four NF4 matrices).
  static BlockWeights from_flat(const at::Tensor& flat, const UnitLayout& layout);
  static BlockWeights from_nf4(const at::Tensor& flat, const UnitLayout& layout,
                               const std::array<std::vector<const nf4::Quantized*>, kMatrixGroups>& q4);
};

// One tensor of a unit's flat buffer, shaped as the slot says (a view: it shares storage and
// autograd history with `flat`). Every view into a flat buffer goes through here: a group that
// is not a multiple of kUnitAlign elements is followed by padding, so the flat buffer is longer
// than its tensors.
at::Tensor slot_view(const at::Tensor& flat, const ParamSlot& slot);

// Views of the head unit's flat buffer; `output` is `tied_output` (the embedding) when the
// model ties them.
struct HeadWeights {
  at::Tensor norm;    // [dim]
  at::Tensor output;  // [vocab, dim]
  static HeadWeights from_flat(const at::Tensor& flat, const UnitLayout& layout, const at::Tensor& tied_output,
                               const LlamaShape& shape);
};

// The embedding table [vocab, dim] in the embedding unit's flat buffer.
at::Tensor embedding_weight(const at::Tensor& embed_flat, const UnitLayout& embed_layout);

// LoRA adapters of one block: views of its adapter unit's flat buffer, indexed by Proj;
// undefined where not targeted.
struct BlockLora {
  at::Tensor a[kProjections], b[kProjections];
  double scale = 1.0, dropout = 0.0;
  bool training = false;
  static BlockLora from_flat(const at::Tensor& flat, const UnitLayout& layout, const LlamaShape& shape, double scale,
                             double dropout, bool training);
  // dropout(x) @ A^T @ B^T * scale of projection p, or undefined when p has no adapter.
  at::Tensor delta(Proj p, const at::Tensor& x) const;
};

// One transformer block: x + attn(norm(x)), then + mlp(norm(.)). x: [B, T, dim]. The family's
// variations come from the weights present: projection biases, and (qwen3) an RMSNorm over each
// head of q and k before RoPE. With `lora`, each targeted projection adds its adapter's delta to
// the frozen base's output (its bias included). With `kv` (this block's layer of rope.cache),
// the keys and values of x's tokens are appended there and attention covers every held position.
// `kernels` selects fused implementations of its pieces (model/options.h).
at::Tensor block_forward(const BlockWeights& w, const at::Tensor& x, const RopeTables& rope, const LlamaShape& shape,
                         const BlockLora* lora = nullptr, KvCache::Layer* kv = nullptr,
                         const KernelOptions& kernels = {});
// The cache layer of block `layer` in rope's attention context, or null when not decoding.
inline KvCache::Layer* cache_layer(const RopeTables& rope, int64_t layer) {
  return rope.cache ? &rope.cache->layers[static_cast<size_t>(layer)] : nullptr;
}

}  // namespace ptrain
