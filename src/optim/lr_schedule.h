// Learning-rate schedule: linear warmup, then cosine / linear decay to lr * min_lr_ratio, or
// constant. A pure function of the step, so resuming needs no schedule state.
#pragma once
#include <cstdint>

#include "optim/options.h"

namespace ptrain {

struct LrSchedule {
  double peak_lr = 0.0;     // optimizer.lr
  int64_t total_steps = 1;  // training.steps
  LrScheduleOptions options;

  // lr for optimizer step `step` (0-based): warmup gives peak*(step+1)/warmup.
  double lr(int64_t step) const;
};

}  // namespace ptrain
