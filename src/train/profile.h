// training.profile_steps: a Kineto trace (LibTorch's profiler: CPU operators and, on CUDA, every
// kernel and copy through CUPTI) of a few consecutive steps, written as a Chrome trace per rank.
#pragma once
#include <cstdint>
#include <memory>
#include <string>

namespace ptrain {

struct Config;

class StepProfiler {
 public:
  // Inactive unless config.training.profile_steps > 0.
  StepProfiler(const Config& config, int rank, bool cuda, std::string out_dir);
  ~StepProfiler();
  void before_step(int64_t step);  // the step about to run (1-based)
  // The step just finished; after the last traced one the trace is written and its path returned
  // (empty otherwise).
  std::string after_step(int64_t step);

 private:
  int64_t first_ = 0, last_ = -1;
  int rank_ = 0;
  bool cuda_ = false, on_ = false, started_ = false;
  std::string out_dir_;
};

}  // namespace ptrain
