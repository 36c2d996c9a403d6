// What a run is built from: the device, the collectives, the sharded model (HF weights or the
// seeded init, a PEFT adapter on top) and the optimizer over its shards. Used by `train`, and
// by `eval`, `check` and `export` where they need a model.
#pragma once
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace ptrain {

struct Config;
struct DistEnv;
class Collectives;
class FsdpModel;
class Optimizer;
struct OptimTarget;

// Tensors under this many elements keep float32 moments with adamw8bit (bitsandbytes' default).
constexpr int64_t kMin8bitNumel = 4096;

// cuda:<local_rank> when training.device resolves to CUDA, else cpu.
c10::Device resolve_device(const Config& config, const DistEnv& env);

// The collectives for this process (MPI / NCCL / single process) per parallel.backend; sets
// the CPU threads per rank.
std::shared_ptr<Collectives> connect(const Config& config, const DistEnv& env, const c10::Device& device);

// Builds the sharded model for `config` on `device`: this rank's slice of the HF weights when
// model.hf_path is set, else the seeded init. (A checkpoint is loaded on top by the caller.)
std::unique_ptr<FsdpModel> build_model(const Config& config, const c10::Device& device,
                                       std::shared_ptr<Collectives> comm);

// One optimizer target per trainable unit: its shard, the decayed prefix of the shard, and the
// shard's first element in a model-wide numbering (stochastic-rounding bits).
std::vector<OptimTarget> optim_targets(FsdpModel& model);

// optimizer.name's optimizer over the model's shards (targets[i] = unit i's shard).
std::unique_ptr<Optimizer> make_optimizer(const Config& config, const FsdpModel& model, std::vector<OptimTarget> targets);

}  // namespace ptrain
