#include "model/llama.h"
#include "model/rope.h"
#include "model/swiglu.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>
#include <cstring>
#include <limits>

#include "model/gemm.h"
#include "model/linear4bit.h"

namespace ptrain {

namespace {

// Splits a flat buffer into shaped views. Its backward writes each piece's gradient into one
// flat gradient once; autograd's own view backward would allocate, zero and add a whole
// flat-sized gradient per piece.
class SplitFlat : public torch::autograd::Function<SplitFlat> {
 public:
  static torch::autograd::variable_list forward(torch::autograd::AutogradContext* ctx, const at::Tensor& flat,
                                                const std::vector<int64_t>& offsets,
                                                const std::vector<std::vector<int64_t>>& shapes) {
    ctx->saved_data["numel"] = flat.numel();
    ctx->saved_data["offsets"] = offsets;
    torch::autograd::variable_list out;
    std::vector<int64_t> numels;
    for (size_t i = 0; i < offsets.size(); ++i) {
      int64_t n = 1;
      for (int64_t d : shapes[i]) n *= d;
      TORCH_CHECK(offsets[i] >= (i ? offsets[i - 1] + numels.back() : 0) && offsets[i] + n <= flat.numel(),
                  "SplitFlat pieces must ascend without overlap inside the flat buffer");
      numels.push_back(n);
      out.push_back(flat.narrow(0, offsets[i], n).view(shapes[i]));
    }
    ctx->saved_data["numels"] = numels;
    return out;
  }

  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grads) {
    const auto offsets = ctx->saved_data["offsets"].toIntVector();
    const auto numels = ctx->saved_data["numels"].toIntVector();
    at::Tensor flat;
    for (const auto& g : grads)
      if (g.defined()) {
        flat = at::empty({ctx->saved_data["numel"].toInt()}, g.options());
        break;
      }
    if (!flat.defined()) return {at::Tensor(), at::Tensor(), at::Tensor()};
    int64_t end = 0;  // pieces ascend; the alignment padding between them gets zeros
    for (size_t i = 0; i < grads.size(); ++i) {
      if (offsets[i] > end) flat.narrow(0, end, offsets[i] - end).zero_();
      at::Tensor dst = flat.narrow(0, offsets[i], numels[i]);
      if (grads[i].defined())
        dst.copy_(grads[i].reshape({-1}));
      else
        dst.zero_();
      end = offsets[i] + numels[i];
    }
    if (end < flat.numel()) flat.narrow(0, end, flat.numel() - end).zero_();
    return {flat, at::Tensor(), at::Tensor()};
  }
};

// Llama 3.1: wavelengths longer than original / low_freq_factor are divided by factor, those
// shorter than original / high_freq_factor kept, and the ones between ramped smoothly.
at::Tensor llama3_scaled(const at::Tensor& inv, const RopeScaling& r) {
  const double old_len = static_cast<double>(r.original_max_seq_len);
  const double low_wavelen = old_len / r.low_freq_factor;
  const double high_wavelen = old_len / r.high_freq_factor;
  at::Tensor wavelen = 2 * M_PI / inv;
  at::Tensor scaled = at::where(wavelen > low_wavelen, inv / r.factor, inv);
  at::Tensor smooth = (old_len / wavelen - r.low_freq_factor) / (r.high_freq_factor - r.low_freq_factor);
  at::Tensor smoothed = (1 - smooth) * scaled / r.factor + smooth * scaled;
  at::Tensor medium = at::logical_not(wavelen < high_wavelen) * at::logical_not(wavelen > low_wavelen);
  return at::where(medium, smoothed, scaled);
}

// YaRN: the dimensions that turn fewer than beta_slow times over the original context take the
// interpolated frequency (divided by factor), those that turn more than beta_fast times keep
// theirs, and a linear ramp over the dimension index joins the two.
at::Tensor yarn_scaled(const at::Tensor& powers, const LlamaShape& s) {
  const RopeScaling& r = s.rope_scaling;
  const double dim = static_cast<double>(s.head_dim);
  auto dimension_of = [&](double rotations) {  // the dimension that turns `rotations` times
    return dim * std::log(static_cast<double>(r.original_max_seq_len) / (rotations * 2 * M_PI)) /
           (2 * std::log(s.rope_theta));
  };
  double low = dimension_of(r.beta_fast);
  double high = dimension_of(r.beta_slow);
  if (r.truncate) {
    low = std::floor(low);
    high = std::ceil(high);
  }
  low = std::max(low, 0.0);
  high = std::min(high, dim - 1);
  if (low == high) high += 0.001;  // as transformers: no zero-width ramp
  at::Tensor ramp = ((at::arange(s.head_dim / 2, at::kLong).to(at::kFloat) - low) / (high - low)).clamp(0, 1);
  at::Tensor keep = 1 - ramp;  // the weight of the original frequency
  return 1.0 / (r.factor * powers) * (1 - keep) + 1.0 / powers * keep;
}

}  // namespace

at::Tensor rope_inv_freq(const LlamaShape& s) {
  // Same float32 ops as transformers' rotary embeddings, so the tables match bit for bit.
  auto arange = at::arange(0, s.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(s.head_dim);
  at::Tensor powers = at::pow(s.rope_theta, arange);
  const auto& r = s.rope_scaling;
  if (r.factor <= 0) return 1.0 / powers;
  switch (r.type) {
    case RopeType::llama3:
      return llama3_scaled(1.0 / powers, r);
    case RopeType::linear:
      return 1.0 / powers / r.factor;
    case RopeType::yarn:
      return yarn_scaled(powers, s);
  }
  TORCH_CHECK(false, "unknown RoPE scaling type");
}

RopeTables rope_tables(const LlamaShape& s, int64_t seq_len, const at::Device& device) {
  at::Tensor t = at::arange(seq_len, at::kLong).to(at::kFloat);
  at::Tensor freqs = at::outer(t, rope_inv_freq(s));  // [T, head_dim/2], float32
  // YaRN scales cos and sin (so every attention logit by its square); 1 for the other types.
  const double scale = s.rope_scaling.table_scale();
  RopeTables r;
  r.cos = freqs.cos().to(device);
  r.sin = freqs.sin().to(device);
  if (scale != 1.0) {
    r.cos.mul_(scale);
    r.sin.mul_(scale);
  }
  return r;
}

KvCache::KvCache(const LlamaShape& s, int64_t batch, int64_t capacity, c10::ScalarType dtype, const at::Device& device)
    : capacity(capacity) {
  for (int64_t l = 0; l < s.n_layers; ++l)
    layers.push_back({at::empty({batch, s.n_kv_heads, capacity, s.head_dim}, at::TensorOptions(dtype).device(device)),
                      at::empty({batch, s.n_kv_heads, capacity, s.head_dim}, at::TensorOptions(dtype).device(device))});
}

int64_t KvCache::bytes() const {
  int64_t n = 0;
  for (const auto& l : layers) n += static_cast<int64_t>(l.k.nbytes() + l.v.nbytes());
  return n;
}

RopeTables cached_positions(const RopeTables& tables, KvCache& cache, int64_t T) {
  TORCH_CHECK(cache.length + T <= cache.capacity, "the KV cache holds ", cache.capacity, " positions; ", cache.length,
              " + ", T, " do not fit");
  TORCH_CHECK(cache.length + T <= tables.cos.size(0), "the RoPE tables are shorter than the cached positions");
  RopeTables r;
  r.cos = tables.cos;
  r.sin = tables.sin;
  const int64_t half = tables.cos.size(1);
  r.token_cos = tables.cos.narrow(0, cache.length, T).view({1, T, 1, half});
  r.token_sin = tables.sin.narrow(0, cache.length, T).view({1, T, 1, half});
  r.cache = &cache;
  return r;
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  // ATen's fused RMSNorm (float32 accumulation); in float32 it is bit-identical to HF's
  // weight * (x * rsqrt(mean(x^2) + eps)) and about 1.5x faster forward + backward on CPU.
  return at::rms_norm(x, {x.size(-1)}, weight, eps);
}

namespace {

// Which positions T new tokens see, after `start` held ones: [T, start + T], token i (position
// start + i) sees j <= start + i and, with a sliding window (> 0), only j > start + i - window.
at::Tensor causal_band(int64_t T, int64_t start, int64_t window, const at::Device& device) {
  const at::Tensor ones = at::ones({T, start + T}, at::TensorOptions(at::kBool).device(device));
  at::Tensor allowed = ones.tril(start);
  if (window > 0) allowed = allowed.logical_and(ones.tril(start - window).logical_not());
  return allowed;
}

// 0 where `allowed`, -inf elsewhere, in `dtype` on `allowed`'s device.
at::Tensor additive_mask(const at::Tensor& allowed, c10::ScalarType dtype) {
  return at::zeros(allowed.sizes(), allowed.options().dtype(dtype))
      .masked_fill_(allowed.logical_not(), -std::numeric_limits<double>::infinity());
}

}  // namespace

RopeTables windowed_positions(const RopeTables& tables, int64_t T, int64_t window, c10::ScalarType mask_dtype) {
  if (window <= 0 || T <= window) return tables;
  RopeTables r = tables;
  // Built on the tables' device: no [T, T] host tensor and copy per forward.
  r.doc_mask = additive_mask(causal_band(T, 0, window, tables.cos.device()).view({1, 1, T, T}), mask_dtype);
  return r;
}

RopeTables packed_positions(const RopeTables& tables, const at::Tensor& doc_ids, c10::ScalarType mask_dtype,
                            int64_t window) {
  TORCH_CHECK(doc_ids.dim() == 2, "doc_ids must be [batch, seq]");
  const at::Tensor docs = doc_ids.to(at::kCPU, at::kLong).contiguous();
  const int64_t B = docs.size(0), T = docs.size(1);
  at::Tensor positions = at::empty({B, T}, at::kLong);
  const int64_t* d = docs.data_ptr<int64_t>();
  int64_t* p = positions.data_ptr<int64_t>();
  for (int64_t b = 0; b < B; ++b)
    for (int64_t t = 0; t < T; ++t) p[b * T + t] = t > 0 && d[b * T + t] == d[b * T + t - 1] ? p[b * T + t - 1] + 1 : 0;
  TORCH_CHECK(positions.max().item<int64_t>() < tables.cos.size(0), "a document is longer than the RoPE tables");
  RopeTables r = tables;
  const auto device = tables.cos.device();
  r.positions = positions.to(device);
  // Gathered once for every block (gathering in each block's RoPE would save a copy per block).
  const int64_t half = tables.cos.size(1);
  const at::Tensor idx = r.positions.reshape({-1});
  r.token_cos = tables.cos.index_select(0, idx).view({B, T, 1, half});
  r.token_sin = tables.sin.index_select(0, idx).view({B, T, 1, half});
  // Within one document, positions are consecutive: the window over rows is the window over
  // positions.
  const at::Tensor same = docs.unsqueeze(2).eq(docs.unsqueeze(1));                                // [B, T, T]
  const at::Tensor allowed = same.logical_and(causal_band(T, 0, window, at::kCPU)).unsqueeze(1);  // [B, 1, T, T]
  r.doc_mask = additive_mask(allowed, mask_dtype).to(device);
  return r;
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope, bool fused) {
  if (rope.token_cos.defined())  // packed documents: each token at its position in its document
    return rope_rotate(x, rope.token_cos, rope.token_sin, fused);
  const int64_t T = x.size(1), half = x.size(3) / 2;
  return rope_rotate(x, rope.cos.narrow(0, 0, T).view({1, T, 1, half}), rope.sin.narrow(0, 0, T).view({1, T, 1, half}),
                     fused);
}

namespace {
bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

// Where a block's tensor group goes in BlockWeights, by its first tensor's name; null if it has
// no place in the forward (a layout the forward does not know).
at::Tensor* piece_of(BlockWeights& w, const std::string& first) {
  static const std::pair<const char*, MatrixGroup> kGroups[] = {{"self_attn.q_proj", MatrixGroup::qkv},
                                                                {"self_attn.o_proj", MatrixGroup::o},
                                                                {"mlp.gate_proj", MatrixGroup::gate_up},
                                                                {"mlp.down_proj", MatrixGroup::down}};
  for (const auto& [module, g] : kGroups) {
    const std::string m(module);
    if (ends_with(first, (m + ".weight").c_str())) return &w.matrix[static_cast<int>(g)];
    if (ends_with(first, (m + ".bias").c_str())) return &w.bias[static_cast<int>(g)];
  }
  if (ends_with(first, "input_layernorm.weight")) return &w.attn_norm;
  if (ends_with(first, "post_attention_layernorm.weight")) return &w.ffn_norm;
  if (ends_with(first, "self_attn.q_norm.weight")) return &w.q_norm;
  if (ends_with(first, "self_attn.k_norm.weight")) return &w.k_norm;
  return nullptr;
}
}  // namespace

BlockWeights BlockWeights::from_flat(const at::Tensor& flat, const UnitLayout& layout) {
  TORCH_CHECK(flat.numel() == layout.numel, "block flat buffer has ", flat.numel(), " elements, layout needs ",
              layout.numel);
  BlockWeights w;
  std::vector<int64_t> offsets;
  std::vector<std::vector<int64_t>> shapes;
  std::vector<at::Tensor*> pieces;
  for (const auto& group : slot_groups(layout)) {  // one piece per group: fused tensors stacked by rows
    std::vector<int64_t> shape = group.front().shape;
    for (size_t i = 1; i < group.size(); ++i) shape[0] += group[i].shape[0];
    at::Tensor* piece = piece_of(w, group.front().name);
    TORCH_CHECK(piece, "block tensor ", group.front().name, " has no place in the forward");
    offsets.push_back(group.front().offset);
    shapes.push_back(std::move(shape));
    pieces.push_back(piece);
  }
  auto v = SplitFlat::apply(flat, offsets, shapes);
  for (size_t i = 0; i < pieces.size(); ++i) *pieces[i] = v[i];
  return w;
}

BlockWeights BlockWeights::from_nf4(const at::Tensor& flat, const UnitLayout& layout,
                                    const std::array<std::vector<const nf4::Quantized*>, kMatrixGroups>& q4) {
  BlockWeights w = from_flat(flat, layout);
  for (int g = 0; g < kMatrixGroups; ++g) w.q4[g] = q4[g];
  return w;
}

at::Tensor slot_view(const at::Tensor& flat, const ParamSlot& slot) {
  return flat.narrow(0, slot.offset, slot.numel).view(slot.shape);
}

HeadWeights HeadWeights::from_flat(const at::Tensor& flat, const UnitLayout& layout, const at::Tensor& tied_output,
                                   const LlamaShape& s) {
  HeadWeights w;
  for (const auto& slot : layout.slots) (slot.name == "lm_head.weight" ? w.output : w.norm) = slot_view(flat, slot);
  if (s.tie_embeddings) w.output = tied_output;
  return w;
}

at::Tensor embedding_weight(const at::Tensor& embed_flat, const UnitLayout& embed_layout) {
  return slot_view(embed_flat, embed_layout.slots.at(0));
}

BlockLora BlockLora::from_flat(const at::Tensor& flat, const UnitLayout& layout, const LlamaShape& s, double scale,
                               double dropout, bool training) {
  BlockLora l;
  l.scale = scale;
  l.dropout = dropout;
  l.training = training;
  const auto projections = block_projections(s);
  for (const auto& slot : layout.slots) {
    for (size_t p = 0; p < projections.size(); ++p) {
      const std::string stem = projections[p].module + ".lora_";
      const auto at_ = slot.name.find(stem);
      if (at_ == std::string::npos) continue;
      (slot.name[at_ + stem.size()] == 'A' ? l.a[p] : l.b[p]) = slot_view(flat, slot);
    }
  }
  return l;
}

at::Tensor BlockLora::delta(Proj p, const at::Tensor& x) const {
  const auto i = static_cast<int>(p);
  if (!a[i].defined()) return at::Tensor();
  at::Tensor in = training && dropout > 0 ? at::dropout(x, dropout, true) : x;
  return gemm::linear(gemm::linear(in, a[i]), b[i]) * scale;
}

namespace {
// The base's matrix group g (dense or 4-bit), with its bias where the family has one.
at::Tensor base_linear(const BlockWeights& w, MatrixGroup g, const at::Tensor& x) {
  const auto i = static_cast<int>(g);
  if (w.q4[i].empty()) return gemm::linear(x, w.matrix[i], w.bias[i]);
  at::Tensor y = linear4bit(x, w.q4[i]);
  return w.bias[i].defined() ? y + w.bias[i] : y;
}

// base + adapter delta of projection p.
at::Tensor with_lora(at::Tensor base, const BlockLora* lora, Proj p, const at::Tensor& x) {
  if (!lora) return base;
  at::Tensor d = lora->delta(p, x);
  return d.defined() ? base + d : base;
}

// [B, T, heads * head_dim] -> [B, heads, T, head_dim]: per-head RMSNorm (when the family has
// one), then RoPE.
at::Tensor heads_with_rope(const at::Tensor& x, int64_t heads, const at::Tensor& norm, const RopeTables& rope,
                           const LlamaShape& s, bool fused_rope) {
  at::Tensor h = x.reshape({x.size(0), x.size(1), heads, s.head_dim});
  if (norm.defined()) h = rms_norm(h, norm, s.norm_eps);
  return apply_rope(h, rope, fused_rope).transpose(1, 2);
}
}  // namespace

at::Tensor block_forward(const BlockWeights& w, const at::Tensor& x, const RopeTables& rope, const LlamaShape& s,
                         const BlockLora* lora, KvCache::Layer* kv, const KernelOptions& kernels) {
  const int64_t B = x.size(0), T = x.size(1), hd = s.head_dim;
  const int64_t Q = s.q_dim(), KV = s.kv_dim();

  at::Tensor hn = rms_norm(x, w.attn_norm, s.norm_eps);
  auto qkv = base_linear(w, MatrixGroup::qkv, hn).split_with_sizes({Q, KV, KV}, -1);
  for (Proj p : {Proj::q, Proj::k, Proj::v})
    qkv[static_cast<size_t>(p)] = with_lora(qkv[static_cast<size_t>(p)], lora, p, hn);
  at::Tensor q = heads_with_rope(qkv[0], s.n_heads, w.q_norm, rope, s, kernels.fused_rope);
  at::Tensor k = heads_with_rope(qkv[1], s.n_kv_heads, w.k_norm, rope, s, kernels.fused_rope);
  at::Tensor v = qkv[2].reshape({B, T, s.n_kv_heads, hd}).transpose(1, 2);
  // Which held positions each new token sees. Without a cache the new tokens are all there is
  // (start = 0); with one they follow its `start` positions, whose keys and values come first.
  // Token i (position start + i) sees positions j <= start + i and, with a sliding window
  // (Mistral), only the last `sliding_window` of them: j > start + i - window.
  const int64_t start = kv ? rope.cache->length : 0;
  if (kv) {
    kv->k.narrow(2, start, T).copy_(k);
    kv->v.narrow(2, start, T).copy_(v);
    k = kv->k.narrow(2, 0, start + T);
    v = kv->v.narrow(2, 0, start + T);
  }
  const int64_t window = s.sliding_window;
  const bool windowed = window > 0 && start + T > window;
  std::optional<at::Tensor> mask;  // none: plain causal (or, one new token after the cache, every position)
  if (rope.doc_mask.defined()) {   // packed documents / the window, made once for every block
    TORCH_CHECK(!kv, "a cached decode takes no precomputed attention mask");
    mask = rope.doc_mask;
  } else if ((start > 0 && T > 1) || windowed) {
    mask = causal_band(T, start, windowed ? window : 0, x.device());
  }
  const at::Tensor attn = at::scaled_dot_product_attention(q, k, v, mask, /*dropout_p=*/0.0,
                                                           /*is_causal=*/!mask && start == 0,
                                                           /*scale=*/std::nullopt,
                                                           /*enable_gqa=*/s.n_kv_heads != s.n_heads);
  at::Tensor ao = attn.transpose(1, 2).reshape({B, T, Q});
  at::Tensor h = x + with_lora(base_linear(w, MatrixGroup::o, ao), lora, Proj::o, ao);

  at::Tensor hn2 = rms_norm(h, w.ffn_norm, s.norm_eps);
  auto gate_up = base_linear(w, MatrixGroup::gate_up, hn2).chunk(2, -1);
  gate_up[0] = with_lora(gate_up[0], lora, Proj::gate, hn2);
  gate_up[1] = with_lora(gate_up[1], lora, Proj::up, hn2);
  at::Tensor act = swiglu(gate_up[0], gate_up[1], kernels.fused_swiglu);
  return h + with_lora(base_linear(w, MatrixGroup::down, act), lora, Proj::down, act);
}

}  // namespace ptrain
