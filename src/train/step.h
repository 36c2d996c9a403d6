// One optimizer step — the data flow every training run repeats: for each micro-batch,
// forward through the FSDP units -> chunked loss -> backward (reduce-scatters into the shard
// gradients); then global-norm clip and the optimizer step on this rank's shards.
//
// The step's loss is the mean over every trained token of the step — all micro-batches of all
// ranks — so a token weighs the same whichever micro-batch holds it (masked chat data gives
// micro-batches different numbers of trained tokens; token windows give equal ones, where this
// is the plain mean of the micro-batch means).
#pragma once
#include <cstdint>
#include <functional>
#include <limits>

#include "data/batch.h"
#include "model/objective.h"

namespace ptrain {

class FsdpModel;
class Optimizer;

// The CUDA allocator's peak allocated bytes in each phase of a step (train/memory.h PhasePeak):
// the highest over the micro-batches; -1 where not measured (off CUDA; the optimizer's phase
// when it runs inside backward).
struct PhasePeaks {
  int64_t forward = -1, backward = -1, optimizer = -1;
  // The allocated bytes as forward and as backward began (the highest over the micro-batches).
  int64_t forward_start = -1, backward_start = -1;
};

struct StepResult {
  double loss = 0.0;           // mean loss over the step's trained tokens, all ranks (nats/token)
  double grad_norm = 0.0;      // global L2 norm of the gradients before clipping, over all ranks
  int64_t trained_tokens = 0;  // the step's trained tokens, all ranks
  // SFT with StepOptions::token_metrics: TRL's SFTTrainer metrics as token means over the step's
  // trained tokens, all ranks — the entropy of the model's next-token distribution (nats) and
  // the share of tokens whose target is its first most likely token; NaN when not measured.
  double entropy = std::numeric_limits<double>::quiet_NaN(), mean_token_accuracy = entropy;
  int64_t num_tokens = 0;        // SFT: the ids of the step's rows, all ranks (Batch::num_tokens)
  PhasePeaks peaks;              // this rank's
  PreferenceMetrics preference;  // preference objectives (pairs > 0): TRL's metrics over the step's pairs
};

struct StepOptions {
  int64_t grad_accum_steps = 1;  // micro-batches per step
  double max_grad_norm = 0.0;    // 0: no clipping
  int64_t loss_chunk = 1024;     // tokens per chunk of the output projection + loss
  bool fused_grad_norm = false;  // kernels.fused_grad_norm (parallel/grad_norm.h)
  // A preference objective (train/preference.h): micro-batches are batches of pairs. Null: SFT.
  const PreferenceObjective* preference = nullptr;
  // SFT: measure StepResult::entropy and mean_token_accuracy (one more pass over each loss
  // chunk's logits; the trainer asks on the steps it logs).
  bool token_metrics = false;
};

// `micro_batch(a)` gives micro-batch a (0 <= a < grad_accum_steps) of this rank on the model's
// device. A step whose micro-batches train no token at all is an error.
using MicroBatchFn = std::function<Batch(int64_t)>;

// The common step: gradients accumulate in the shards' .grad(), then clip, then step at `lr`.
StepResult train_step(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                      const StepOptions& options);

// optimizer.in_backward: each unit's shard is stepped the moment its reduced gradient exists
// (inside backward) and the gradient is dropped, so no gradient is ever stored. No clipping;
// grad_norm is the norm of those gradients. Installs and removes model.on_grad_ready itself.
StepResult train_step_in_backward(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                                  const StepOptions& options);

}  // namespace ptrain
