// The training loop and the pieces `train`, `eval` and `check` share.
#pragma once
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
class TokenData;
class Optimizer;
struct OptimTarget;

// Tensors under this many elements keep float32 moments with adamw8bit (bitsandbytes' default).
constexpr int64_t kMin8bitNumel = 4096;

// cuda:<local_rank> when training.device resolves to CUDA, else cpu.
c10::Device resolve_device(const Config& config, const DistEnv& env);

// The collectives for this process (MPI / NCCL / single process) per parallel.backend.
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

// `ptrain export --merge`: a LoRA checkpoint's adapters merged into its base (W + alpha/r · B·A;
// an NF4 base is dequantized first) as a full-precision (float32) Hugging Face directory. The
// base is rebuilt from the checkpoint's config (model.hf_path, or the seeded init).
void export_merged(const std::string& checkpoint_dir, const std::string& out_dir);

// Runs training as configured on every rank; returns the process exit code (0, or 130 when
// stopped by SIGINT/SIGTERM after writing a checkpoint).
int train(const Config& config);

struct EvalResult {
  double mean_loss = 0.0;  // nats per token
  double perplexity = 0.0;
  int64_t tokens = 0;      // predicted tokens scored
  int64_t windows = 0;
};
// Scores every consecutive non-overlapping window of seq_len+1 tokens in [begin, end), in
// order, `batch` windows at a time (collective: every rank scores the same windows).
// max_windows < 0 means all.
EvalResult evaluate(FsdpModel& model, const TokenData& data, int64_t begin, int64_t end, int64_t seq_len,
                    int64_t batch, int64_t loss_chunk, int64_t max_windows = -1);

}  // namespace ptrain
