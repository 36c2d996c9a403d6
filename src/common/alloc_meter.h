// Counts the bytes LibTorch's CPU allocator hands out on this thread (and the intra-op threads
// it propagates to) while a meter is installed: current net bytes and their peak. Uses the
// memory-reporting hook the profiler uses, so it measures real allocations, not estimates.
#pragma once
#include <c10/core/Allocator.h>
#include <c10/util/ThreadLocalDebugInfo.h>

#include <algorithm>
#include <atomic>
#include <cstdint>
#include <memory>

namespace ptrain {

struct AllocationMeter : c10::MemoryReportingInfoBase {
  std::atomic<int64_t> net{0}, peak{0};
  void reportMemoryUsage(void*, int64_t size, size_t, size_t, c10::Device device) override {
    if (!device.is_cpu()) return;
    const int64_t now = net += size;
    int64_t p = peak.load();
    while (now > p && !peak.compare_exchange_weak(p, now)) {
    }
  }
  bool memoryProfilingEnabled() const override { return true; }
};

// Installs a meter for its lifetime.
class MeterScope {
 public:
  MeterScope() : meter_(std::make_shared<AllocationMeter>()), guard_(c10::DebugInfoKind::PROFILER_STATE, meter_) {}
  const AllocationMeter& meter() const { return *meter_; }

 private:
  std::shared_ptr<AllocationMeter> meter_;
  c10::DebugInfoGuard guard_;
};

}  // namespace ptrain
