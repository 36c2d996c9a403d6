#include "train/memory.h"

#include <sys/resource.h>

#include <nlohmann/json.hpp>

#include "config/config.h"
#include "model/layout.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"
#include "train/trainer.h"
#include "parallel/fsdp.h"
#include "parallel/precision.h"
#include "quant/nf4_math.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

namespace ptrain {

std::string MemoryReport::to_json() const {
  nlohmann::ordered_json j = {{"rank", rank},
                              {"world_size", world_size},
                              {"num_params", num_params},
                              {"param_bytes", param_bytes},
                              {"grad_bytes", grad_bytes},
                              {"optimizer_state_bytes", optimizer_state_bytes},
                              {"master_weight_bytes", master_weight_bytes},
                              {"frozen_base_bytes", frozen_base_bytes},
                              {"nf4_params", nf4_params},
                              {"nf4_bytes", nf4_bytes},
                              {"nf4_bytes_per_param", nf4_params ? static_cast<double>(nf4_bytes) / nf4_params : 0.0},
                              {"total_state_bytes", total_state_bytes()},
                              {"state_bytes_per_param", num_params ? static_cast<double>(total_state_bytes()) / num_params : 0.0}};
  return j.dump(2);
}

MemoryReport measure_memory(const FsdpModel& model, const Optimizer& optim) {
  MemoryReport r;
  r.rank = model.comm().rank();
  r.world_size = model.comm().world_size();
  for (const auto& u : model.trainable_units()) {
    r.num_params += u.shard.numel();
    r.param_bytes += u.shard.nbytes();
    if (u.shard.grad().defined()) r.grad_bytes += u.shard.grad().nbytes();
  }
  if (model.lora())
    for (const auto& u : model.units()) r.frozen_base_bytes += u.shard.nbytes();
  r.nf4_params = model.nf4_params();
  r.nf4_bytes = model.nf4_bytes();
  r.frozen_base_bytes += r.nf4_bytes;
  r.optimizer_state_bytes = optim.state_bytes();
  return r;
}

MemoryReport predict_memory(const Config& config, int world_size) {
  const PrecisionPolicy policy = PrecisionPolicy::from_config(config);
  MemoryReport r;
  r.world_size = world_size;
  // Every rank holds shard_numel() elements of each trainable unit (the last ones zero-padded).
  const auto& s = config.model.shape;
  const bool nf4 = config.lora.enabled && config.quant.base == "nf4";
  const auto full = llama_units(s, config.model.init_std);
  const auto base = nf4 ? llama_units_without_block_matrices(s, config.model.init_std) : full;
  const auto trainable = config.lora.enabled ? lora_units(s, config.lora.targets, config.lora.rank) : base;
  for (const auto& u : trainable) r.num_params += shard_numel(u.numel, world_size);
  if (config.lora.enabled)  // the frozen base, sharded in the compute dtype
    for (const auto& u : base) r.frozen_base_bytes += shard_numel(u.numel, world_size) * c10::elementSize(policy.compute_dtype);
  if (nf4) {  // every rank holds all NF4 matrices: 4 bits per weight + scales (nf4::Quantized::bytes)
    for (const auto& u : full) {
      if (u.kind != UnitKind::block) continue;
      for (const auto& g : block_matrix_groups(u)) {
        int64_t n = 0;
        for (const auto& slot : g) n += slot.numel;
        const int64_t blocks = (n + nf4::kBlock - 1) / nf4::kBlock;
        r.nf4_params += n;
        r.nf4_bytes += (n + 1) / 2 + (config.quant.double_quant ? blocks + ((blocks + nf4::kStatsBlock - 1) / nf4::kStatsBlock) * 4 + 4
                                                                 : blocks * 4);
      }
    }
    r.frozen_base_bytes += r.nf4_bytes;
  }
  const int64_t master = c10::elementSize(policy.master_dtype), optim = c10::elementSize(policy.optim_dtype);
  r.param_bytes = r.num_params * master;
  r.grad_bytes = config.optimizer.in_backward ? 0 : r.num_params * master;  // in-backward: never a full set
  r.optimizer_state_bytes = 2 * r.num_params * optim;
  if (config.optimizer.name == "adamw8bit") {  // this rank's (rank 0's) blocks, as the optimizer lays them out
    r.optimizer_state_bytes = 0;
    for (const auto& u : trainable)
      r.optimizer_state_bytes += Blocking::of(u, 0, shard_numel(u.numel, world_size), kMin8bitNumel).state_bytes();
  }
  return r;
}

PeakMemory peak_memory(const c10::Device& device) {
#ifdef PTRAIN_CUDA
  if (device.is_cuda()) {
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index() < 0 ? 0 : device.index());
    return {stats.allocated_bytes[0].peak, "cuda_allocator_peak_allocated"};
  }
#endif
  struct rusage ru {};
  ::getrusage(RUSAGE_SELF, &ru);
  return {static_cast<int64_t>(ru.ru_maxrss) * 1024, "process_peak_rss"};
}

}  // namespace ptrain
