// The training loop and the pieces `train`, `eval` and `check` share.
#pragma once
#include <c10/core/Device.h>

#include <memory>
#include <string>

namespace ptrain {

struct Config;
class FsdpModel;
class TokenData;

c10::Device resolve_device(const Config& config);

// Builds the model for `config` on `device`: HF weights when model.hf_path is set, else the
// seeded init. (A checkpoint, when resuming, is loaded on top by the caller.)
std::unique_ptr<FsdpModel> build_model(const Config& config, const c10::Device& device);

// Runs training as configured; returns the process exit code (0, or 130 when interrupted).
int train(const Config& config);

struct EvalResult {
  double mean_loss = 0.0;  // nats per token
  double perplexity = 0.0;
  int64_t tokens = 0;      // predicted tokens scored
  int64_t windows = 0;
};
// Scores every consecutive non-overlapping window of seq_len+1 tokens in [begin, end), in
// order, `batch` windows at a time. max_windows < 0 means all.
EvalResult evaluate(FsdpModel& model, const TokenData& data, int64_t begin, int64_t end, int64_t seq_len,
                    int64_t batch, int64_t loss_chunk, int64_t max_windows = -1);

}  // namespace ptrain
