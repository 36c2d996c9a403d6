// The training loop (`ptrain train`) and evaluation over held-out windows.
#pragma once
#include <cstdint>

namespace ptrain {

struct Config;
class FsdpModel;
class TokenData;

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
