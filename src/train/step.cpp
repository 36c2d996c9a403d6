#include "train/step.h"

#include <ATen/ATen.h>

#include <cmath>
#include <vector>

#include "optim/optimizer.h"
#include "parallel/collectives.h"
#include "parallel/fsdp.h"
#include "parallel/grad_norm.h"

namespace ptrain {

namespace {
// Forward and backward of every micro-batch; returns this rank's mean loss.
double accumulate(FsdpModel& model, const MicroBatchFn& micro_batch, const StepOptions& o) {
  double loss_sum = 0.0;
  for (int64_t a = 0; a < o.grad_accum_steps; ++a) {
    const at::Tensor batch = micro_batch(a);
    const int64_t T = batch.size(1) - 1;
    at::Tensor loss = model.forward_loss(batch.narrow(1, 0, T), batch.narrow(1, 1, T), o.loss_chunk);
    (loss / static_cast<double>(o.grad_accum_steps)).backward();
    model.finish_backward();  // normally a no-op: the embedding's reduce-scatter completes the last one
    loss_sum += loss.item<double>();
  }
  return loss_sum / static_cast<double>(o.grad_accum_steps);
}
}  // namespace

StepResult train_step(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                      const StepOptions& options) {
  model.zero_grad();
  StepResult r;
  r.loss = accumulate(model, micro_batch, options);
  std::vector<at::Tensor> grads;
  for (auto& u : model.trainable_units()) grads.push_back(u.shard.grad());
  r.grad_norm = clip_grad_norm(grads, options.max_grad_norm, &model.comm());
  optim.step(lr);
  return r;
}

StepResult train_step_in_backward(FsdpModel& model, Optimizer& optim, const MicroBatchFn& micro_batch, double lr,
                                  const StepOptions& options) {
  model.zero_grad();
  optim.begin_step();
  GradNorm norm;
  model.on_grad_ready = [&](size_t unit, const at::Tensor& g) {
    norm.add(g);
    optim.update({{unit, g}}, lr);
  };
  StepResult r;
  try {
    r.loss = accumulate(model, micro_batch, options);
  } catch (...) {
    model.on_grad_ready = nullptr;
    throw;
  }
  model.on_grad_ready = nullptr;
  r.grad_norm = norm.total(&model.comm());
  return r;
}

}  // namespace ptrain
