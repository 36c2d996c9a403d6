#include "train/profile.h"

#include <torch/csrc/autograd/profiler_kineto.h>

#include <set>

#include "common/log.h"
#include "config/config.h"

namespace ptrain {

namespace {
namespace kineto = torch::autograd::profiler;
using torch::profiler::impl::ActivityType;
using torch::profiler::impl::ProfilerConfig;
using torch::profiler::impl::ProfilerState;
}  // namespace

StepProfiler::StepProfiler(const Config& c, int rank, bool cuda, std::string out_dir)
    : rank_(rank), cuda_(cuda), out_dir_(std::move(out_dir)) {
  if (c.training.profile_steps <= 0) return;
  first_ = c.training.profile_start;
  last_ = first_ + c.training.profile_steps - 1;
}

StepProfiler::~StepProfiler() {
  if (on_) kineto::disableProfiler();  // an exception inside the traced steps: no trace
}

void StepProfiler::before_step(int64_t step) {
  if (first_ > 0 && !started_ && step > first_) {  // a resumed run that starts past the traced steps
    log::warn("training.profile_start = ", first_, " but this run starts at step ", step,
              " (resumed): nothing is traced");
    first_ = 0;
  }
  started_ = true;
  if (first_ == 0 || step != first_) return;
  const ProfilerConfig config(ProfilerState::KINETO, /*report_input_shapes=*/true);
  std::set<ActivityType> activities{ActivityType::CPU};
  if (cuda_) activities.insert(ActivityType::CUDA);
  kineto::prepareProfiler(config, activities);
  kineto::enableProfiler(config, activities);
  on_ = true;
}

std::string StepProfiler::after_step(int64_t step) {
  if (!on_ || step != last_) return "";
  on_ = false;
  const std::string path = out_dir_ + "/trace.rank" + std::to_string(rank_) + ".json";
  kineto::disableProfiler()->save(path);
  return path;
}

}  // namespace ptrain
