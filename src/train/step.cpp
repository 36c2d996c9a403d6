#include "train/step.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <vector>

#include "common/error.h"
#include "model/loss.h"
#include "optim/optimizer.h"
#include "parallel/collectives.h"
#include "parallel/fsdp.h"
#include "parallel/grad_norm.h"
#include "train/memory.h"
#include "train/preference.h"

namespace ptrain {

namespace {

// Forward and backward of every micro-batch. Micro-batch a's mean loss is weighted by its share
// of the step's trained tokens, times the world size that the gradients' reduce-scatter
// averages over; so the gradient is that of the mean over all the step's trained tokens. The
// step's result but its gradient norm.
StepResult accumulate(FsdpModel& model, const MicroBatchFn& micro_batch, const StepOptions& o) {
  StepResult r;
  if (o.preference) {
    accumulate_preference(model, micro_batch, o, *o.preference, r);
    return r;
  }
  std::vector<Batch> batches;
  std::vector<int64_t> counts;
  int64_t ids = 0;
  for (int64_t a = 0; a < o.grad_accum_steps; ++a) {
    batches.push_back(micro_batch(a));
    counts.push_back(batches.back().trained_tokens());
    ids += batches.back().num_tokens;
  }
  Collectives& comm = model.comm();
  at::Tensor total = at::tensor(
      {static_cast<double>(std::accumulate(counts.begin(), counts.end(), int64_t{0})), static_cast<double>(ids)},
      at::kDouble);
  comm.all_reduce_sum(total);
  const double n = total[0].item<double>();
  if (n <= 0)
    throw RuntimeError("a training step has no trained tokens (every target is masked); check the data's loss mask");
  // Summed on the model's device and read once, after the step's all-reduce: reading each
  // micro-batch's loss would wait for the device after every forward/backward. [loss sum,
  // entropy sum, top-1 hits] over the trained tokens.
  at::Tensor sums = at::zeros({3}, at::TensorOptions(at::kDouble).device(model.device()));
  PhasePeaks& peaks = r.peaks;
  for (size_t a = 0; a < batches.size(); ++a) {
    const Batch& b = batches[a];
    const PhasePeak forward(model.device());
    at::Tensor stats;
    at::Tensor loss =
        model.forward_loss(b.inputs, b.targets, o.loss_chunk, b.doc_ids, o.token_metrics ? &stats : nullptr);
    if (o.token_metrics) sums.narrow(0, 1, 2) += trained_token_stats(stats, b.targets);
    peaks.forward = std::max(peaks.forward, forward.peak());
    peaks.forward_start = std::max(peaks.forward_start, forward.start());
    const double weight = static_cast<double>(counts[a]) * comm.world_size() / n;
    const PhasePeak backward(model.device());
    peaks.backward_start = std::max(peaks.backward_start, backward.start());
    (loss * weight).backward();  // also at weight 0: every rank takes part in the reduce-scatters
    model.finish_backward();     // normally a no-op: the embedding's reduce-scatter completes the last one
    peaks.backward = std::max(peaks.backward, backward.peak());
    sums.narrow(0, 0, 1) += loss.detach().to(at::kDouble) * static_cast<double>(counts[a]);
  }
  comm.all_reduce_sum(sums);
  const at::Tensor means = (sums / n).cpu();
  r.loss = means[0].item<double>();
  r.trained_tokens = static_cast<int64_t>(n);
  if (o.token_metrics) {
    r.entropy = means[1].item<double>();
    r.mean_token_accuracy = means[2].item<double>();
  }
  r.num_tokens = static_cast<int64_t>(total[1].item<double>());
  return r;
}
}  // namespace

StepResult train_step(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                      const StepOptions& options) {
  model.zero_grad();
  StepResult r = accumulate(model, micro_batch, options);
  const PhasePeak optimizer(model.device());
  std::vector<at::Tensor> grads;
  for (auto& u : model.trained_units()) grads.push_back(u.shard.grad());
  r.grad_norm = clip_grad_norm(grads, options.max_grad_norm, &model.comm(), options.fused_grad_norm);
  optim.step(lr);
  r.peaks.optimizer = optimizer.peak();
  return r;
}

StepResult train_step_in_backward(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                                  const StepOptions& options) {
  model.zero_grad();
  optim.begin_step();
  GradNorm norm(options.fused_grad_norm);
  model.on_grad_ready = [&](size_t unit, const at::Tensor& g) {
    norm.add(g);
    optim.update({{unit, g}}, lr);
  };
  StepResult r;
  try {
    r = accumulate(model, micro_batch, options);
  } catch (...) {
    model.on_grad_ready = nullptr;
    throw;
  }
  model.on_grad_ready = nullptr;
  r.grad_norm = norm.total(&model.comm());
  return r;
}

}  // namespace ptrain
