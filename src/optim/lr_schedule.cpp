#include "optim/lr_schedule.h"

#include <algorithm>
#include <cmath>

namespace ptrain {

double LrSchedule::lr(int64_t step) const {
  const auto& [warmup_steps, decay, min_lr_ratio] = options;
  if (step < warmup_steps) return peak_lr * static_cast<double>(step + 1) / static_cast<double>(warmup_steps);
  if (decay == Decay::constant) return peak_lr;
  const double span = static_cast<double>(std::max<int64_t>(1, total_steps - warmup_steps - 1));
  const double progress = std::clamp(static_cast<double>(step - warmup_steps) / span, 0.0, 1.0);
  const double min_lr = peak_lr * min_lr_ratio;
  if (decay == Decay::linear) return peak_lr - (peak_lr - min_lr) * progress;
  return min_lr + (peak_lr - min_lr) * 0.5 * (1.0 + std::cos(M_PI * progress));
}

}  // namespace ptrain
