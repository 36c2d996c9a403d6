// `ptrain check`: validates a config and prints the resolved config, the model and its
// family, the precision table, the dataset as training will read it and the predicted per-rank
// allocator peak (train/memory.h); with a GPU memory budget it exits 2 when the plan does not
// fit, listing changes that would, each with its predicted peak.
#pragma once
#include <string>
#include <vector>

namespace ptrain {

struct CheckRequest {
  std::string config;             // --config FILE
  std::vector<std::string> sets;  // --set section.key=value overrides
  int world_size = 1;             // --world-size N: the ranks the plan is for
  double gpu_memory_gib = 0;      // --gpu-memory GIB: the budget per GPU (0: none)
  bool json = false;              // --json: the predicted state bytes only (memory.json's keys)
  bool plan = false;              // --plan: for another machine (no data files, checkpoints or GPUs looked for)
};

// The exit code: 0 (valid, and fits when a budget is given) or 2 (does not fit).
int check(const CheckRequest& request);

}  // namespace ptrain
