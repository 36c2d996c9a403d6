// One optimizer step — the data flow every training run repeats: for each micro-batch,
// forward through the FSDP units -> chunked loss -> backward (reduce-scatters into the shard
// gradients); then global-norm clip and the optimizer step on this rank's shards.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <functional>

namespace ptrain {

class FsdpModel;
class Optimizer;

struct StepResult {
  double loss = 0.0;       // this rank's mean loss over its micro-batches (nats/token)
  double grad_norm = 0.0;  // global L2 norm of the gradients before clipping, over all ranks
};

struct StepOptions {
  int64_t grad_accum_steps = 1;  // micro-batches per step
  double max_grad_norm = 0.0;    // 0: no clipping
  int64_t loss_chunk = 1024;     // tokens per chunk of the output projection + loss
};

// `micro_batch(a)` gives micro-batch a (0 <= a < grad_accum_steps) of this rank: token ids
// [B, T+1] on the model's device; inputs are [:, :T], targets [:, 1:].
using MicroBatchFn = std::function<at::Tensor(int64_t)>;

// The common step: gradients accumulate in the shards' .grad(), then clip, then step at `lr`.
StepResult train_step(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                      const StepOptions& options);

// optimizer.in_backward: each unit's shard is stepped the moment its reduced gradient exists
// (inside backward) and the gradient is dropped, so no gradient is ever stored. No clipping;
// grad_norm is the norm of those gradients. Installs and removes model.on_grad_ready itself.
StepResult train_step_in_backward(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                                  const StepOptions& options);

}  // namespace ptrain
