// The optimizer part's options, as the config's [optimizer] and [lr_schedule] sections hold
// them: each field's initialiser is the key's default (docs/config.md shows them), in this one
// place. Validation: problems() beside each struct (its section's own rules); config/validate.cpp
// holds the rules that read several sections.
#pragma once
#include <cstdint>
#include <vector>

#include "common/check.h"

namespace ptrain {

// [optimizer]
enum class OptimizerName { adamw, adamw8bit };
struct OptimizerOptions {
  OptimizerName name = OptimizerName::adamw;
  double lr = 3e-4;                      // peak learning rate
  std::vector<double> betas{0.9, 0.95};  // Adam beta1, beta2
  double eps = 1e-8;
  double weight_decay = 0.1;        // decoupled; matrices only (not norm weights)
  bool in_backward = false;         // step each unit during backward
  OptionProblems problems() const;  // lr, betas, eps, weight decay
};

// [lr_schedule]
enum class Decay { cosine, linear, constant };  // after warmup
struct LrScheduleOptions {
  int64_t warmup_steps = 20;    // linear warmup from lr/warmup to lr
  Decay decay = Decay::cosine;  // after warmup
  double min_lr_ratio = 0.1;    // final lr = lr * min_lr_ratio (cosine, linear)
  OptionProblems problems() const;
};

}  // namespace ptrain
