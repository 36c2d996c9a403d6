// Memory truth: bytes of persistent state summed from the actual tensors (measure) and the
// same numbers predicted from the config alone (predict, used by `ptrain check`), plus the
// process / allocator peak.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <string>

namespace ptrain {

struct Config;
class FsdpModel;
class Optimizer;

struct MemoryReport {
  int rank = 0;
  int world_size = 1;
  int64_t num_params = 0;             // parameter elements held by this rank (its padded shards)
  int64_t param_bytes = 0;            // sharded parameters (in fp32/mixed they are the master copy)
  int64_t grad_bytes = 0;             // gradient shards
  int64_t optimizer_state_bytes = 0;  // optimizer moments
  int64_t master_weight_bytes = 0;    // extra master copies beyond param_bytes (none in fp32/mixed)
  int64_t frozen_base_bytes = 0;      // LoRA: the frozen base weights (not trained, no grads or state)
  int64_t nf4_params = 0;             // NF4 base: weights held in 4 bits (part of the frozen base)
  int64_t nf4_bytes = 0;              //   their packed codes + scales (nf4_bytes / nf4_params ~ 0.516)
  // Trainable state; with LoRA num_params counts adapter parameters and the frozen base is
  // reported apart (frozen_base_bytes).
  int64_t total_state_bytes() const { return param_bytes + grad_bytes + optimizer_state_bytes + master_weight_bytes; }
  std::string to_json() const;
};

MemoryReport measure_memory(const FsdpModel& model, const Optimizer& optim);
MemoryReport predict_memory(const Config& config, int world_size);

struct PeakMemory {
  int64_t bytes = 0;
  std::string source;  // "cuda_allocator_peak_allocated" or "process_peak_rss"
};
PeakMemory peak_memory(const c10::Device& device);

}  // namespace ptrain
