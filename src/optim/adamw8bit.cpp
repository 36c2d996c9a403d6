#include "optim/adamw8bit.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <c10/util/BFloat16.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "optim/sr_bits.h"
#include "quant/blockwise8.h"
#include "quant/blockwise8_math.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>

#include "adamw8bit_cuda.h"
#endif

namespace ptrain {

namespace {
constexpr int64_t B = q8::kBlock;
static_assert(kUnitAlign % q8::kBlock == 0, "8-bit blocks must tile aligned groups");

// Table layout inside tables_: [signed code | unsigned code | signed mids | unsigned mids].
constexpr int64_t kSignedCode = 0, kUnsignedCode = 256, kSignedMids = 512, kUnsignedMids = 767, kTables = 1022;
}  // namespace

Blocking Blocking::of(const UnitLayout& layout, int64_t shard_offset, int64_t shard_numel, int64_t min_8bit_numel) {
  TORCH_CHECK(shard_offset % B == 0 && shard_numel % B == 0, "8-bit state needs 256-aligned shards");
  auto starts = std::make_shared<std::vector<int64_t>>();
  for (size_t g = 0; g < layout.group_begins.size(); ++g) {
    const int64_t begin = layout.group_begins[g];
    const int64_t end = g + 1 < layout.group_begins.size() ? layout.group_begins[g + 1] : layout.numel;
    int64_t real = 0;  // the group's tensor elements, padding excluded
    for (const auto& s : layout.slots)
      if (s.offset >= begin && s.offset < end) real += s.numel;
    if (real >= min_8bit_numel) continue;
    for (int64_t e = begin; e < end; e += B) starts->push_back(e);
  }
  Blocking b;
  b.n_blocks = shard_numel / B;
  b.slot.assign(static_cast<size_t>(b.n_blocks), -1);
  for (int64_t e : *starts)
    if (e >= shard_offset && e < shard_offset + shard_numel)
      b.slot[static_cast<size_t>((e - shard_offset) / B)] = static_cast<int32_t>(b.n_fp32++);
  b.fp32_starts = std::move(starts);
  return b;
}

int64_t Blocking::state_bytes() const { return 2 * (n_blocks * B * 1 + n_blocks * 4 + n_fp32 * B * 4); }

AdamW8bit::AdamW8bit(std::vector<OptimTarget> targets, std::vector<Blocking> blocking, AdamW8bitOptions options)
    : Optimizer(std::move(targets)), blocking_(std::move(blocking)), opt_(options) {
  weight_decay_ = opt_.weight_decay;
  TORCH_CHECK(blocking_.size() == targets_.size(), "one Blocking per target");
  at::Tensor sc = q8::dynamic_map(true), uc = q8::dynamic_map(false);
  tables_ = at::cat({sc, uc, q8::midpoints(sc), q8::midpoints(uc)});
  const float* t = tables_.data_ptr<float>();
  // Zero moments encode as the code of 0 with absmax 0.
  const auto zero_m = static_cast<uint8_t>(q8::nearest_code(t + kSignedMids, 0.0f));
  const auto zero_v = static_cast<uint8_t>(q8::nearest_code(t + kUnsignedMids, 0.0f));
  for (size_t i = 0; i < targets_.size(); ++i) {
    const auto& p = targets_[i].param;
    const Blocking& b = blocking_[i];
    TORCH_CHECK(p.numel() == b.n_blocks * B, "target ", targets_[i].name, " has ", p.numel(),
                " elements, its blocking ", b.n_blocks * B);
    auto opts = p.options().requires_grad(false);
    m_.push_back({at::full({p.numel()}, zero_m, opts.dtype(at::kByte)), at::zeros({b.n_blocks}, opts.dtype(at::kFloat)),
                  at::zeros({b.n_fp32 * B}, opts.dtype(at::kFloat))});
    v_.push_back({at::full({p.numel()}, zero_v, opts.dtype(at::kByte)), at::zeros({b.n_blocks}, opts.dtype(at::kFloat)),
                  at::zeros({b.n_fp32 * B}, opts.dtype(at::kFloat))});
    slot_.push_back(at::tensor(b.slot, at::kInt).to(p.device()));
  }
  if (!targets_.empty() && targets_[0].param.is_cuda()) tables_device_ = tables_.to(targets_[0].param.device());
}

namespace {
// One target's step on the CPU, block by block: its parameters and gradient (float32 or
// bfloat16), its quantized moments (or float32 ones where the block is too small to quantize).
struct CpuShard {
  const float* tab;  // the code tables and midpoints
  const int32_t* slot;
  uint8_t *mc, *vc;
  float *ma, *va, *m32, *v32;
  void* p_raw;
  const void* g_raw;
  bool bf16, sr;
  uint64_t seed, offset;
  int64_t decay_blocks;
  const q8::AdamScalars& s;

  // Updates element e of the block (moments in mm / vv), storing the new parameter.
  void update_element(int64_t e, bool decay, float& mm, float& vv) const {
    float p, g;
    if (bf16) {
      p = static_cast<float>(static_cast<const c10::BFloat16*>(p_raw)[e]);
      g = static_cast<float>(static_cast<const c10::BFloat16*>(g_raw)[e]);
    } else {
      p = static_cast<const float*>(p_raw)[e];
      g = static_cast<const float*>(g_raw)[e];
    }
    q8::adam_element(s, decay, g, p, mm, vv);
    if (!bf16) {
      static_cast<float*>(p_raw)[e] = p;
    } else if (sr) {
      uint32_t bits;
      std::memcpy(&bits, &p, 4);
      const uint16_t r = sr::round_bits(bits, sr::hash(seed, offset + static_cast<uint64_t>(e)));
      std::memcpy(static_cast<c10::BFloat16*>(p_raw) + e, &r, 2);
    } else {
      static_cast<c10::BFloat16*>(p_raw)[e] = c10::BFloat16(p);
    }
  }

  // Block b's new moments, requantized with their new absmax.
  void store_quantized(int64_t b, const float* mb, const float* vb) const {
    float am = 0.0f, av = 0.0f;
    for (int64_t j = 0; j < B; ++j) {
      am = std::max(am, std::abs(mb[j]));
      av = std::max(av, vb[j]);
    }
    ma[b] = am;
    va[b] = av;
    const float im = q8::inverse_scale(am), iv = q8::inverse_scale(av);
    for (int64_t j = 0; j < B; ++j) {
      mc[b * B + j] = static_cast<uint8_t>(q8::nearest_code(tab + kSignedMids, q8::clamp_unit(mb[j] * im)));
      vc[b * B + j] = static_cast<uint8_t>(q8::nearest_code(tab + kUnsignedMids, q8::clamp_unit(vb[j] * iv)));
    }
  }

  void update_block(int64_t b) const {
    float mb[B], vb[B];
    const int32_t f = slot[b];
    for (int64_t j = 0; j < B; ++j) {
      const int64_t e = b * B + j;
      mb[j] = f >= 0 ? m32[f * B + j] : tab[kSignedCode + mc[e]] * ma[b];
      vb[j] = f >= 0 ? v32[f * B + j] : tab[kUnsignedCode + vc[e]] * va[b];
      update_element(e, b < decay_blocks, mb[j], vb[j]);
    }
    if (f < 0) return store_quantized(b, mb, vb);
    std::memcpy(m32 + f * B, mb, sizeof mb);
    std::memcpy(v32 + f * B, vb, sizeof vb);
  }
};
}  // namespace

q8::AdamScalars AdamW8bit::scalars(double lr) const {
  const double t = static_cast<double>(steps_);
  q8::AdamScalars s{};
  s.beta1 = static_cast<float>(opt_.beta1);
  s.beta2 = static_cast<float>(opt_.beta2);
  s.eps = static_cast<float>(opt_.eps);
  s.lr = static_cast<float>(lr);
  s.decay_factor = static_cast<float>(1.0 - lr * opt_.weight_decay);
  s.step_size = static_cast<float>(lr / (1.0 - std::pow(opt_.beta1, t)));
  s.bias_correction2_sqrt = static_cast<float>(std::sqrt(1.0 - std::pow(opt_.beta2, t)));
  return s;
}

void AdamW8bit::step_cuda(size_t i, const at::Tensor& param, const at::Tensor& grad, const q8::AdamScalars& s,
                          uint64_t seed) {
#ifdef PTRAIN_CUDA
  const OptimTarget& tg = targets_[i];
  Moment &m = m_[i], &v = v_[i];
  kernels::AdamW8bitShard k{param.data_ptr(),
                            param.scalar_type() == at::kBFloat16,
                            grad.data_ptr(),
                            m.codes.data_ptr<uint8_t>(),
                            v.codes.data_ptr<uint8_t>(),
                            m.absmax.data_ptr<float>(),
                            v.absmax.data_ptr<float>(),
                            m.fp32.data_ptr<float>(),
                            v.fp32.data_ptr<float>(),
                            slot_[i].data_ptr<int32_t>(),
                            blocking_[i].n_blocks,
                            opt_.weight_decay != 0 ? tg.decay_numel / B : 0,
                            tables_device_.data_ptr<float>(),
                            s,
                            opt_.stochastic_rounding,
                            seed,
                            tg.global_offset};
  kernels::adamw8bit_step(k, at::cuda::getCurrentCUDAStream(param.device().index()).stream());
#else
  TORCH_CHECK(false, "AdamW8bit on CUDA needs a build with nvcc");
#endif
}

void AdamW8bit::step_cpu(size_t i, const at::Tensor& param, const at::Tensor& grad, const q8::AdamScalars& s,
                         uint64_t seed) {
  const OptimTarget& tg = targets_[i];
  Moment &m = m_[i], &v = v_[i];
  const bool bf16 = param.scalar_type() == at::kBFloat16;
  const CpuShard shard{tables_.data_ptr<float>(),
                       slot_[i].data_ptr<int32_t>(),
                       m.codes.data_ptr<uint8_t>(),
                       v.codes.data_ptr<uint8_t>(),
                       m.absmax.data_ptr<float>(),
                       v.absmax.data_ptr<float>(),
                       m.fp32.data_ptr<float>(),
                       v.fp32.data_ptr<float>(),
                       param.data_ptr(),
                       grad.data_ptr(),
                       bf16,
                       opt_.stochastic_rounding && bf16,
                       seed,
                       tg.global_offset,
                       opt_.weight_decay != 0 ? tg.decay_numel / B : 0,
                       s};
  at::parallel_for(0, blocking_[i].n_blocks, 8, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) shard.update_block(b);
  });
}

void AdamW8bit::apply(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) {
  at::NoGradGuard no_grad;
  const q8::AdamScalars s = scalars(lr);
  const uint64_t seed = sr::step_seed(opt_.seed, steps_);
  for (const auto& [i, grad_in] : grads) {
    at::Tensor param = targets_[i].param.detach();
    at::Tensor grad = grad_in.to(param.scalar_type()).contiguous();
    TORCH_CHECK(param.scalar_type() == at::kBFloat16 || param.scalar_type() == at::kFloat,
                "AdamW8bit updates float32 or bfloat16 parameters");
    if (param.is_cuda())
      step_cuda(i, param, grad, s, seed);
    else
      step_cpu(i, param, grad, s, seed);
  }
}

at::Tensor AdamW8bit::dequantized(size_t i, const Moment& m, bool is_signed) const {
  at::Tensor code = tables_.narrow(0, is_signed ? kSignedCode : kUnsignedCode, 256);
  at::Tensor out = q8::dequantize_blockwise(m.codes.cpu(), m.absmax.cpu(), code, B);
  const auto& slot = blocking_[i].slot;
  for (size_t b = 0; b < slot.size(); ++b)
    if (slot[b] >= 0) out.narrow(0, static_cast<int64_t>(b) * B, B).copy_(m.fp32.narrow(0, slot[b] * B, B));
  return out;
}

at::Tensor AdamW8bit::exp_avg(size_t i) const { return dequantized(i, m_[i], true); }
at::Tensor AdamW8bit::exp_avg_sq(size_t i) const { return dequantized(i, v_[i], false); }

std::vector<OptimState> AdamW8bit::state() const {
  std::vector<OptimState> out;
  auto element = [](int64_t e) { return e; };
  auto block = [](int64_t e) { return e / B; };
  for (size_t i = 0; i < targets_.size(); ++i) {
    auto starts = blocking_[i].fp32_starts;
    auto fp32 = [starts](int64_t e) {
      return B * static_cast<int64_t>(std::lower_bound(starts->begin(), starts->end(), e) - starts->begin());
    };
    const std::string& n = targets_[i].name;
    for (const auto& [name, mo] :
         {std::pair<std::string, const Moment*>{".exp_avg", &m_[i]}, {".exp_avg_sq", &v_[i]}}) {
      out.push_back({n + name + ".codes", i, mo->codes, element});
      out.push_back({n + name + ".absmax", i, mo->absmax, block});
      out.push_back({n + name + ".fp32", i, mo->fp32, fp32});
    }
  }
  return out;
}

}  // namespace ptrain
