#include "model/options.h"

namespace ptrain {

OptionProblems LoraOptions::problems() const {
  OptionProblems p;
  p.check("lora.rank", at_least(rank, 1));
  p.check("lora.alpha", positive(alpha));
  p.check("lora.dropout", dropout >= 0 && dropout < 1 ? "" : "must be in [0, 1)");
  return p;
}

}  // namespace ptrain
