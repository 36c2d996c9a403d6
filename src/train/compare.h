// `ptrain compare`: trains the same config in several precision modes from the same init on
// the same data, then summarises (Markdown + CSV) and plots (SVG via gnuplot) the result.
#pragma once
#include <string>
#include <vector>

namespace ptrain {

struct CompareOptions {
  std::string config_path;
  std::vector<std::string> overrides;  // --set values, applied to every mode
  std::vector<std::string> modes;      // fp32, mixed, bf16, bf16-sr
  int64_t steps = 0;                   // 0 keeps training.steps
  std::string out_dir;                 // default runs/compare-<run.name>
};

// The --set overrides that select a mode; throws UsageError for an unknown mode.
std::vector<std::string> mode_overrides(const std::string& mode);

int compare(const CompareOptions& options);

}  // namespace ptrain
