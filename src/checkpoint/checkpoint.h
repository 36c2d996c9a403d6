// Sharded training checkpoints: <root>/step_N/ holding, for every rank r,
//   model.rank<r>.safetensors      rank r's slice of each unit's flat master weights, keyed by
//                                  unit name ("embed", "block.0", ..., "head"); padding omitted
//   optimizer.rank<r>.safetensors  the optimizer's state slices ("<unit>.exp_avg", ...; see
//                                  OptimState for how non-elementwise state is sliced)
//   rng.rank<r>.safetensors        LibTorch generator state
// and, written last by rank 0,
//   meta.json    step, data position, optimizer steps, world size, model shape, unit sizes,
//                and every file's size and CRC-32 (each rank records its own as it writes them)
//   config.toml  the resolved config that wrote it
// Rank r's slice of a unit is elements [r*S, r*S + S) of the flat buffer, S = shard_numel(numel, ws).
// Every rank writes into one hidden temp directory; after a barrier rank 0 writes meta.json,
// fsyncs and renames the directory to step_N in one atomic step. Only directories with
// meta.json are ever picked up, so a crash mid-write never damages an earlier checkpoint; a rank
// that fails to write its part (a full disk) makes every rank fail the save, and its temporary
// directory is removed. Every file is checked against its recorded size and CRC-32 as it is read.
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
  // The ids of the preference rows trained on so far, all ranks (TRL's num_tokens: DPO, KTO)
  uint64_t num_tokens = 0;
};

// Writes <root>/step_<progress.step> (collective: every rank calls it); keeps the newest
// `keep` complete checkpoints. Returns the directory written.
std::string save_checkpoint(const std::string& root, const FsdpModel& model, const Optimizer& optim,
                            const TrainProgress& progress, int64_t keep, const std::string& config_toml);

// Newest complete checkpoint under root ("" when none).
std::string latest_checkpoint(const std::string& root);

// Tidies `root` before a run (rank 0): a `.step_N.old` that a crash left between the two renames
// of a rewrite, with no step_N beside it, is put back as step_N; the other temporaries of crashed
// or failed writes (`.step_N.tmp`, `.step_N.old`) are removed. Logs each.
void recover_checkpoint_dir(const std::string& root);

// checkpoint.resume = "auto" (collective): loads the newest complete checkpoint under `root` that
// every rank reads back intact, warning which newer ones were skipped and why. Returns the
// directory loaded; "" when root holds no checkpoint; throws when it holds some and none loads.
std::string resume_latest(const std::string& root, FsdpModel& model, Optimizer* optim, TrainProgress& progress);

// Restores model, optimizer, RNG and progress. Throws RuntimeError if the checkpoint is
// incomplete, corrupt, or was written for a different model. Without an optimizer (eval,
// export) the weights are converted to the model's master dtype; with one, the master dtypes
// must be the same.
void load_checkpoint(const std::string& dir, FsdpModel& model, Optimizer* optim, TrainProgress& progress);

// Writes an HF model directory of the checkpoint's family (config.json + model.safetensors, float32) from a checkpoint.
void export_hf(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace ptrain
