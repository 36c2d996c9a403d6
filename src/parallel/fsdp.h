// FSDP units: each unit (embedding, each block, head) owns one flat parameter buffer; the
// rank holds its shard of it as the master copy. Forward "gathers" each unit into the
// compute dtype, runs the model piece, and drops the gathered copy.
// This version runs at world size 1 (the shard is the whole unit); multi-rank gathering
// and reduce-scatter slot in at FlatUnit::gather.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "model/layout.h"
#include "model/llama.h"
#include "model/loss.h"
#include "parallel/precision.h"

namespace ptrain {

class HfCheckpoint;

struct FlatUnit {
  UnitLayout layout;
  at::Tensor shard;  // master parameters, 1-D, leaf with requires_grad; .grad() after backward
  // The unit's full flat weights in the compute dtype, connected to `shard` by autograd.
  at::Tensor gather(c10::ScalarType compute_dtype) const;
};

class FsdpModel {
 public:
  FsdpModel(const LlamaShape& shape, const PrecisionPolicy& policy, const at::Device& device,
            double init_std);

  // Seeded per unit (unit i draws from a generator seeded by (seed, i)), on the CPU, so the
  // weights are the same for every device and world size.
  void init_weights(uint64_t seed);
  // Copies every parameter from an HF checkpoint; shapes must match.
  void load_hf(const HfCheckpoint& ckpt);

  // Mean cross-entropy over unmasked targets. inputs/targets: [B, T] int64.
  at::Tensor forward_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk);
  // Summed loss, no autograd.
  LossSum eval_loss(const at::Tensor& inputs, const at::Tensor& targets, int64_t loss_chunk);
  // Final hidden states [B*T, dim] and the output projection, in the compute dtype.
  std::pair<at::Tensor, at::Tensor> hidden_and_output(const at::Tensor& inputs);

  std::vector<FlatUnit>& units() { return units_; }
  const std::vector<FlatUnit>& units() const { return units_; }
  // Every parameter by HF name as a view of its unit's master shard.
  std::vector<std::pair<std::string, at::Tensor>> named_parameters() const;
  void zero_grad();
  const LlamaShape& shape() const { return shape_; }
  const PrecisionPolicy& policy() const { return policy_; }
  const at::Device& device() const { return device_; }
  int64_t num_params() const;

 private:
  const RopeTables& rope(int64_t seq_len);
  LlamaShape shape_;
  PrecisionPolicy policy_;
  at::Device device_;
  std::vector<FlatUnit> units_;
  RopeTables rope_;
  int64_t rope_len_ = 0;
};

}  // namespace ptrain
