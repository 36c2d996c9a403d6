#include "data/options.h"

namespace ptrain {

const std::vector<std::string>& data_format_names() {
  static const std::vector<std::string> names{"text", "tokens", "jsonl", "parquet", "json"};
  return names;
}

OptionProblems DataOptions::problems() const {
  OptionProblems p;
  p.check("data.micro_batch_size", at_least(micro_batch_size, 1));
  p.check("data.val_fraction", val_fraction >= 0 && val_fraction <= 0.5 ? "" : "must be in [0, 0.5]");
  return p;
}

}  // namespace ptrain
