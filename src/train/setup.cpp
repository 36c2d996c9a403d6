#include "train/setup.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "common/alloc_meter.h"
#include "common/log.h"
#include "config/config.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "parallel/precision.h"

namespace ptrain {

c10::Device resolve_device(const Config& c, const DistEnv& env) {
  if (c.training.device == DeviceChoice::cuda || (c.training.device == DeviceChoice::automatic && torch::cuda::is_available()))
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  return c10::Device(c10::kCPU);
}

std::shared_ptr<Collectives> connect(const Config& c, const DistEnv& env, const c10::Device& device) {
  log::set_rank(env.rank, env.world_size);
  if (device.is_cpu()) {
    if (c.training.threads > 0) {
      at::set_num_threads(static_cast<int>(c.training.threads));
    } else if (env.world_size > 1) {
      // Ranks on one node share its cores.
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      const int per_node = local ? std::max(1, std::atoi(local)) : env.world_size;
      at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / per_node));
    }
  }
  return make_collectives(env, name_of(c.parallel.backend), device, c.parallel.timeout_s);
}

std::unique_ptr<FsdpModel> build_model(const Config& c, const c10::Device& device, std::shared_ptr<Collectives> comm) {
  FsdpOptions o;
  o.reshard_after_forward = c.parallel.reshard_after_forward;
  o.activation_checkpointing = c.memory.activation_checkpointing == Checkpointing::full;
  o.activation_offloading = c.memory.activation_offloading;
  o.prefetch = c.parallel.prefetch;
  o.lora = c.lora.enabled;
  o.lora_targets = c.lora.targets;
  o.lora_rank = c.lora.rank;
  o.lora_alpha = c.lora.alpha;
  o.lora_dropout = c.lora.dropout;
  o.nf4_base = c.quant.base == QuantBase::nf4;
  o.double_quant = c.quant.double_quant;
  auto model = std::make_unique<FsdpModel>(c.model.shape, precision_policy(c), device, c.model.init_std,
                                           std::move(comm), o);
  if (!c.model.hf_path.empty()) {
    {
      MeterScope scope;  // host allocations during the load: the full-precision model must never be among them
      model->load(HfCheckpoint(c.model.hf_path).by_name());
      if (model->lora())
        log::info("loaded ", c.model.hf_path, (c.quant.base == QuantBase::nf4 ? " (NF4, one matrix group at a time)" : ""),
                  ": peak host allocation during the load ", log::bytes(static_cast<double>(scope.meter().peak.load())),
                  " (the checkpoint's full-precision weights: ", log::bytes(4.0 * static_cast<double>(model->num_params())),
                  " in float32)");
    }
    model->init_adapters(static_cast<uint64_t>(c.run.seed));
  } else {
    model->init_weights(static_cast<uint64_t>(c.run.seed));
  }
  if (!c.lora.adapter_path.empty()) model->load_adapters(read_peft(c.lora.adapter_path).tensors);
  return model;
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const FsdpModel& model, std::vector<OptimTarget> targets) {
  const auto& o = c.optimizer;
  const bool sr = model.policy().stochastic_rounding;
  const auto seed = static_cast<uint64_t>(c.run.seed);
  if (o.name == OptimizerName::adamw8bit) {
    std::vector<Blocking> blocking;
    for (const auto& u : model.trainable_units())
      blocking.push_back(Blocking::of(u.layout, u.shard_offset, u.shard_numel, kMin8bitNumel));
    return std::make_unique<AdamW8bit>(std::move(targets), std::move(blocking),
                                       AdamW8bitOptions{{o.betas[0], o.betas[1], o.eps, o.weight_decay, sr, seed}, kMin8bitNumel});
  }
  return std::make_unique<AdamW>(std::move(targets), AdamWOptions{o.betas[0], o.betas[1], o.eps, o.weight_decay, sr, seed});
}

std::vector<OptimTarget> optim_targets(FsdpModel& model) {
  std::vector<OptimTarget> targets;
  for (size_t i = 0; i < model.trainable_units().size(); ++i) {
    auto& u = model.trainable_units()[i];
    targets.push_back({u.layout.name, u.shard, std::clamp<int64_t>(u.layout.decay_numel - u.shard_offset, 0, u.shard_numel),
                       (static_cast<uint64_t>(i) << 40) + static_cast<uint64_t>(u.shard_offset)});
  }
  return targets;
}

}  // namespace ptrain
