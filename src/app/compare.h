// `ptrain compare`: trains the same config in several precision modes from the same init on
// the same data, over one or more seeds, then summarises (Markdown + CSV: mean and spread over
// the seeds, updates lost to rounding, state bytes) and plots (SVG via gnuplot, a band per mode).
#pragma once
#include <string>
#include <vector>

namespace ptrain {

struct CompareOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set values, applied to every mode
  std::vector<std::string> modes;      // fp32, mixed, bf16, bf16-sr, bf16-kahan, bf16-adam8bit
  int64_t steps = 0;                   // 0 keeps training.steps
  int seeds = 1;                       // run.seed, run.seed + 1, ...; more than one: DIR/<mode>/seed<S>
  std::string out_dir;                 // default runs/compare-<run.name>
};

// The --set overrides that select a mode; throws UsageError for an unknown mode.
std::vector<std::string> mode_overrides(const std::string& mode);

// A mode's final loss over its seeds.
struct SeedStats {
  int n = 0;
  double mean = 0, std = 0, min = 0, max = 0;  // std: the sample standard deviation (n - 1)
};
SeedStats seed_stats(const std::vector<double>& values);
// A difference counts only when it exceeds the seed spread: both have 2+ seeds and their
// ranges (lowest to highest seed) do not overlap.
bool beyond_seed_spread(const SeedStats& a, const SeedStats& b);

int compare(const CompareOptions& options);

}  // namespace ptrain
