// Training checkpoints: <root>/step_N/ holding
//   model.safetensors      each unit's master shard, keyed by unit name ("embed", "block.0", ...)
//   optimizer.safetensors  "<unit>.exp_avg", "<unit>.exp_avg_sq"
//   rng.safetensors        LibTorch generator states
//   meta.json              step, data position, optimizer step count, model shape, units
//   config.toml            the resolved config that wrote it
// A checkpoint is written into a hidden temp directory, every file fsynced, then renamed to
// step_N in one atomic step; only directories with meta.json are ever picked up, so a crash
// mid-write never damages or replaces an earlier checkpoint.
#pragma once
#include <cstdint>
#include <string>

namespace ptrain {

class FsdpModel;
class AdamW;

struct TrainProgress {
  int64_t step = 0;      // optimizer steps completed
  uint64_t samples = 0;  // global samples consumed (data position)
};

// Writes <root>/step_<progress.step>; keeps the newest `keep` complete checkpoints. Returns
// the directory written.
std::string save_checkpoint(const std::string& root, const FsdpModel& model, const AdamW& optim,
                            const TrainProgress& progress, int64_t keep, const std::string& config_toml);

// Newest complete checkpoint under root ("" when none).
std::string latest_checkpoint(const std::string& root);

// Restores model, optimizer, RNG and progress. Throws RuntimeError if the checkpoint is
// incomplete, corrupt, or was written for a different model.
void load_checkpoint(const std::string& dir, FsdpModel& model, AdamW* optim, TrainProgress& progress);

// Writes an HF Llama directory (config.json + model.safetensors, float32) from a checkpoint.
void export_hf(const std::string& checkpoint_dir, const std::string& out_dir);

}  // namespace ptrain
