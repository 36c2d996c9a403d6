#include "data/options.h"

namespace ptrain {

OptionProblems DataOptions::problems() const {
  OptionProblems p;
  p.check("data.micro_batch_size", at_least(micro_batch_size, 1));
  p.check("data.val_fraction", val_fraction >= 0 && val_fraction <= 0.5 ? "" : "must be in [0, 0.5]");
  return p;
}

}  // namespace ptrain
