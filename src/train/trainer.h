// The training loop (`ptrain train`) and evaluation over held-out rows.
#pragma once
#include <cstdint>
#include <limits>

namespace ptrain {

struct Config;
class FsdpModel;
class RowSource;

// Runs training as configured on every rank; returns the process exit code (0, or 130 when
// stopped by SIGINT/SIGTERM after writing a checkpoint).
int train(const Config& config);

struct EvalResult {
  double mean_loss = 0.0;  // nats per token
  double perplexity = 0.0;
  int64_t tokens = 0;  // predicted (trained) tokens scored
  int64_t rows = 0;
  // With token_metrics: TRL's SFT metrics as token means over the same tokens — the entropy of
  // the next-token distribution (nats) and the share whose target is its first most likely
  // token; NaN when not measured.
  double entropy = std::numeric_limits<double>::quiet_NaN(), mean_token_accuracy = entropy;
};
// Scores the validation rows of `data` in order, `batch` rows at a time (collective: every rank
// scores the same rows); the loss is the mean over their trained targets. max_rows < 0: all.
EvalResult evaluate(FsdpModel& model, const RowSource& data, int64_t batch, int64_t loss_chunk, int64_t max_rows = -1,
                    bool token_metrics = false);

}  // namespace ptrain
