// Sharded training checkpoints: <root>/step_N/ holding, for every rank r,
//   model.rank<r>.safetensors      rank r's slice of each unit's flat master weights, keyed by
//                                  unit name ("embed", "block.0", ..., "head"); padding omitted
//   optimizer.rank<r>.safetensors  the optimizer's state slices ("<unit>.exp_avg", ...; see
//                                  OptimState for how non-elementwise state is sliced)
//   rng.rank<r>.safetensors        LibTorch generator state
// and, written last by rank 0,
//   meta.json    step, data position, optimizer steps, world size, model shape, unit sizes
//   config.toml  the resolved config that wrote it
// Rank r's slice of a unit is elements [r*S, r*S + S) of the flat buffer, S = shard_numel(numel, ws).
// Every rank writes into one hidden temp directory; after a barrier rank 0 writes meta.json,
// fsyncs and renames the directory to step_N in one atomic step. Only directories with
// meta.json are ever picked up, so a crash mid-write never damages an earlier checkpoint.
// Loading reshards: any world size reads the slices that overlap its own.
#pragma once
#include <cstdint>
#include <string>

namespace ptrain {

class FsdpModel;
class Optimizer;

struct TrainProgress {
  int64_t step = 0;      // optimizer steps completed
  uint64_t samples = 0;  // global rows consumed (data position)
  std::string data;      // fingerprint of the rows read (RowSource::fingerprint); "" if unknown
};

// Writes <root>/step_<progress.step> (collective: every rank calls it); keeps the newest
// `keep` complete checkpoints. Returns the directory written.
std::string save_checkpoint(const std::string& root, const FsdpModel& model, const Optimizer& optim,
                            const TrainProgress& progress, int64_t keep, const std::string& config_toml);

// Newest complete checkpoint under root ("" when none).
std::string latest_checkpoint(const std::string& root);

// Restores model, optimizer, RNG and progress. Throws RuntimeError if the checkpoint is
// incomplete, corrupt, or was written for a different model. Without an optimizer (eval,
// export) the weights are converted to the model's master dtype; with one, the master dtypes
// must be the same.
void load_checkpoint(const std::string& dir, FsdpModel& model, Optimizer* optim, TrainProgress& progress);

// Writes an HF model directory of the checkpoint's family (config.json + model.safetensors, float32) from a checkpoint.
void export_hf(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace ptrain
