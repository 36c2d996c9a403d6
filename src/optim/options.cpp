#include "optim/options.h"

namespace ptrain {

OptionProblems OptimizerOptions::problems() const {
  OptionProblems p;
  p.check("optimizer.lr", positive(lr));
  p.check("optimizer.betas", betas.size() == 2 && betas[0] >= 0 && betas[0] < 1 && betas[1] >= 0 && betas[1] < 1
                                 ? ""
                                 : "must be two numbers in [0, 1), e.g. [0.9, 0.95]");
  p.check("optimizer.eps", positive(eps));
  p.check("optimizer.weight_decay", weight_decay >= 0 ? "" : "must be >= 0");
  return p;
}

OptionProblems LrScheduleOptions::problems() const {
  OptionProblems p;
  p.check("lr_schedule.warmup_steps", at_least(warmup_steps, 0));
  p.check("lr_schedule.min_lr_ratio", min_lr_ratio >= 0 && min_lr_ratio <= 1 ? "" : "must be in [0, 1]");
  return p;
}

}  // namespace ptrain
