// What a run is built from: the device, the collectives, the sharded model (HF weights or the
// seeded init, a PEFT adapter on top) and the optimizer over its shards. Used by `train`, and
// by `eval`, `check` and `export` where they need a model.
#pragma once
#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ptrain {

struct Config;
struct DistEnv;
class Collectives;
class FsdpModel;
class PairedRows;
class Optimizer;
class RowSource;
struct OptimTarget;
struct FsdpOptions;
struct ModelPlan;

// Tensors under this many elements keep float32 moments with adamw8bit (bitsandbytes' default).
constexpr int64_t kMin8bitNumel = 4096;

// cuda:<local_rank> when training.device resolves to CUDA (made the current device; a local rank
// without a GPU of its own is a UsageError), else cpu.
c10::Device resolve_device(const Config& config, const DistEnv& env);

// The collectives for this process (MPI / NCCL / single process) per parallel.backend; sets
// the CPU threads per rank.
std::shared_ptr<Collectives> connect(const Config& config, const DistEnv& env, const c10::Device& device);

// The FSDP options a config asks for, and the model plan they give (model/plan.h): the units
// build_model allocates, read by the memory planner and export.
FsdpOptions fsdp_options(const Config& config);
ModelPlan model_plan(const Config& config);

// Builds the sharded model for `config` on `device`: this rank's slice of the HF weights when
// model.hf_path is set, else the seeded init. (A checkpoint is loaded on top by the caller.)
std::unique_ptr<FsdpModel> build_model(const Config& config, const c10::Device& device,
                                       std::shared_ptr<Collectives> comm);

// DPO's preference.ref_model: builds the reference (config/config.h reference_config), scores
// every pair of `data` with it (train/preference.h precompute_reference) and frees it before
// returning: [pairs, 2] float32 on the host, as precompute_ref_log_probs keeps them.
at::Tensor score_ref_model(const Config& config, const c10::Device& device, std::shared_ptr<Collectives> comm,
                           const PairedRows& data);

// One optimizer target per trainable unit: its shard, the decayed prefix of the shard, and the
// shard's first element in a model-wide numbering (stochastic-rounding bits).
std::vector<OptimTarget> optim_targets(FsdpModel& model);

// The rows a run reads and what they hold, for the log and `ptrain check`.
struct RunData {
  std::unique_ptr<RowSource> rows;
  std::vector<std::string> report;  // lines: samples/tokens, what was cut or left out, row fill
};
// data.path as data.format says: windows of a token stream, or the samples of a JSONL /
// Parquet file — mapped from the sample cache (data.cache; rank 0 tokenizes the file into it
// when it is missing or stale, with progress each second, and the other ranks map it after),
// or tokenized into memory — one per row or packed. `comm` null: a single process.
// `eval_only`: every window / sample is validation (`ptrain eval`). A data file that cannot be
// used — a malformed record (FILE:LINE), an unknown role, no usable sample — is a ConfigError
// on data.path on every rank: nothing has started.
RunData open_data(const Config& config, Collectives* comm = nullptr, const c10::Device& device = c10::Device(c10::kCPU),
                  bool eval_only = false);

// optimizer.name's optimizer over the model's shards (targets[i] = unit i's shard).
std::unique_ptr<Optimizer> make_optimizer(const Config& config, const FsdpModel& model,
                                          std::vector<OptimTarget> targets);

}  // namespace ptrain
