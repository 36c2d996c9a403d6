// AdamW8bit: bitsandbytes' blockwise 8-bit AdamW on flat shards. Each 256-element block of a
// shard keeps its first moment as uint8 codes of the signed dynamic map and its second as
// codes of the unsigned map, each with a float32 absmax; every step dequantizes, updates in
// float32 (torch AdamW order), takes a new absmax and requantizes to the nearest code (the
// signed map holds 0, so a moment never changes sign). Tensor groups with fewer than
// `min_8bit_numel` elements keep float32 moments, decided on the whole tensor, never on a
// shard. Since groups and shards are aligned to 256 (model/layout.h), blocks never straddle
// ranks: state is identical at every world size and reshards exactly through checkpoints.
// ~2.03 bytes of state per parameter instead of 8.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

#include "model/layout.h"
#include "optim/adamw.h"
#include "optim/optimizer.h"
#include "quant/blockwise8_math.h"

namespace ptrain {

// AdamW's hyperparameters (stochastic rounding of bf16 parameters included) plus:
struct AdamW8bitOptions : AdamWOptions {
  int64_t min_8bit_numel = 4096;  // bitsandbytes' min_8bit_size
};

// Which blocks of one shard keep float32 moments.
struct Blocking {
  int64_t n_blocks = 0;  // shard_numel / 256
  // Unit-wide element offsets of every block with float32 moments, ascending (whole unit).
  std::shared_ptr<const std::vector<int64_t>> fp32_starts;
  std::vector<int32_t> slot;  // per shard block: -1 = 8-bit, else index among this shard's fp32 blocks
  int64_t n_fp32 = 0;         // fp32 blocks in this shard

  static Blocking of(const UnitLayout& layout, int64_t shard_offset, int64_t shard_numel, int64_t min_8bit_numel);
  int64_t state_bytes() const;  // 2 x (codes + absmax + float32 moments)
};

class AdamW8bit : public Optimizer {
 public:
  // blocking[i] describes targets[i]'s shard (its param holds n_blocks * 256 elements).
  AdamW8bit(std::vector<OptimTarget> targets, std::vector<Blocking> blocking, AdamW8bitOptions options);

  // Per target: "<name>.exp_avg.codes" / ".absmax" / ".fp32" and the same for exp_avg_sq.
  std::vector<OptimState> state() const override;

  // Float32 moments of target i as the update sees them (dequantized), for tests.
  at::Tensor exp_avg(size_t i) const;
  at::Tensor exp_avg_sq(size_t i) const;

 protected:
  void apply(const std::vector<std::pair<size_t, at::Tensor>>& grads, double lr) override;
  at::Tensor first_moment(size_t i) const override { return exp_avg(i); }

 private:
  struct Moment {
    at::Tensor codes, absmax, fp32;
  };
  at::Tensor dequantized(size_t i, const Moment& m, bool is_signed) const;
  // The step's scalars at learning rate lr (bias corrections of step steps_), and one target's
  // update on each device.
  q8::AdamScalars scalars(double lr) const;
  void step_cuda(size_t i, const at::Tensor& param, const at::Tensor& grad, const q8::AdamScalars& s, uint64_t seed);
  void step_cpu(size_t i, const at::Tensor& param, const at::Tensor& grad, const q8::AdamScalars& s, uint64_t seed);
  std::vector<Blocking> blocking_;
  std::vector<at::Tensor> slot_;  // int32 [n_blocks] on the params' device
  std::vector<Moment> m_, v_;
  at::Tensor tables_;  // signed code, unsigned code, signed mids, unsigned mids (float32, 1022)
  at::Tensor tables_device_;
  AdamW8bitOptions opt_;
};

}  // namespace ptrain
