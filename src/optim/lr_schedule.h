// Learning-rate schedule: linear warmup, then cosine / linear decay to lr * min_lr_ratio, or
// constant. A pure function of the step, so resuming needs no schedule state.
#pragma once
#include <cstdint>

namespace ptrain {

// After warmup (lr_schedule.decay in the config).
enum class Decay { cosine, linear, constant };

struct LrSchedule {
  double peak_lr = 3e-4;
  int64_t warmup_steps = 0;
  int64_t total_steps = 1;
  Decay decay = Decay::cosine;
  double min_lr_ratio = 0.0;

  // lr for optimizer step `step` (0-based): warmup gives peak*(step+1)/warmup.
  double lr(int64_t step) const;
};

}  // namespace ptrain
