#include "model/llama.h"

#include <ATen/ATen.h>

#include <cmath>

namespace ptrain {

at::Tensor rope_inv_freq(const LlamaShape& s) {
  // Same float32 ops as transformers' LlamaRotaryEmbedding, so the tables match bit for bit.
  auto arange = at::arange(0, s.head_dim, 2, at::kLong).to(at::kFloat) / static_cast<double>(s.head_dim);
  at::Tensor inv = 1.0 / at::pow(s.rope_theta, arange);
  const auto& r = s.rope_scaling;
  if (r.factor <= 0) return inv;
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

RopeTables rope_tables(const LlamaShape& s, int64_t seq_len, const at::Device& device) {
  at::Tensor t = at::arange(seq_len, at::kLong).to(at::kFloat);
  at::Tensor freqs = at::outer(t, rope_inv_freq(s));  // [T, head_dim/2], float32
  return {freqs.cos().to(device), freqs.sin().to(device)};
}

at::Tensor rms_norm(const at::Tensor& x, const at::Tensor& weight, double eps) {
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor normed = xf * at::rsqrt(xf.pow(2).mean(-1, /*keepdim=*/true) + eps);
  return weight * normed.to(x.scalar_type());
}

at::Tensor apply_rope(const at::Tensor& x, const RopeTables& rope) {
  const int64_t T = x.size(1), half = x.size(3) / 2;
  at::Tensor xf = x.to(at::kFloat);
  at::Tensor x1 = xf.narrow(-1, 0, half), x2 = xf.narrow(-1, half, half);
  at::Tensor c = rope.cos.narrow(0, 0, T).view({1, T, 1, half});
  at::Tensor s = rope.sin.narrow(0, 0, T).view({1, T, 1, half});
  return at::cat({x1 * c - x2 * s, x2 * c + x1 * s}, -1).to(x.scalar_type());
}

BlockWeights BlockWeights::from_flat(const at::Tensor& flat, const LlamaShape& s) {
  const int64_t D = s.dim, Q = s.q_dim(), KV = s.kv_dim(), F = s.ffn_dim;
  int64_t off = 0;
  auto take = [&](int64_t rows, int64_t cols) {
    at::Tensor v = flat.narrow(0, off, rows * cols).view({rows, cols});
    off += rows * cols;
    return v;
  };
  BlockWeights w;
  w.wqkv = take(Q + 2 * KV, D);
  w.wo = take(D, Q);
  w.w_gate_up = take(2 * F, D);
  w.w_down = take(D, F);
  w.attn_norm = flat.narrow(0, off, D);
  w.ffn_norm = flat.narrow(0, off + D, D);
  return w;
}

HeadWeights HeadWeights::from_flat(const at::Tensor& flat, const at::Tensor& embed_flat, const LlamaShape& s) {
  HeadWeights w;
  const int64_t out = s.tie_embeddings ? 0 : s.vocab_size * s.dim;
  w.output = s.tie_embeddings ? embedding_weight(embed_flat, s) : flat.narrow(0, 0, out).view({s.vocab_size, s.dim});
  w.norm = flat.narrow(0, out, s.dim);
  return w;
}

at::Tensor embedding_weight(const at::Tensor& embed_flat, const LlamaShape& s) {
  return embed_flat.view({s.vocab_size, s.dim});
}

at::Tensor block_forward(const BlockWeights& w, const at::Tensor& x, const RopeTables& rope, const LlamaShape& s) {
  const int64_t B = x.size(0), T = x.size(1), hd = s.head_dim;
  const int64_t Q = s.q_dim(), KV = s.kv_dim(), F = s.ffn_dim;

  at::Tensor qkv = at::linear(rms_norm(x, w.attn_norm, s.norm_eps), w.wqkv);
  at::Tensor q = apply_rope(qkv.narrow(-1, 0, Q).view({B, T, s.n_heads, hd}), rope).transpose(1, 2);
  at::Tensor k = apply_rope(qkv.narrow(-1, Q, KV).view({B, T, s.n_kv_heads, hd}), rope).transpose(1, 2);
  at::Tensor v = qkv.narrow(-1, Q + KV, KV).view({B, T, s.n_kv_heads, hd}).transpose(1, 2);
  at::Tensor attn = at::scaled_dot_product_attention(q, k, v, /*attn_mask=*/{}, /*dropout_p=*/0.0,
                                                     /*is_causal=*/true, /*scale=*/std::nullopt,
                                                     /*enable_gqa=*/s.n_kv_heads != s.n_heads);
  at::Tensor h = x + at::linear(attn.transpose(1, 2).reshape({B, T, Q}), w.wo);

  at::Tensor gate_up = at::linear(rms_norm(h, w.ffn_norm, s.norm_eps), w.w_gate_up);
  at::Tensor act = at::silu(gate_up.narrow(-1, 0, F)) * gate_up.narrow(-1, F, F);
  return h + at::linear(act, w.w_down);
}

}  // namespace ptrain
