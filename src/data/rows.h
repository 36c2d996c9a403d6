// Rows: what training and evaluation read. A row is seq_len positions, each an input id and
// the id it predicts (or -100). Row k of the training order is a pure function of the data,
// the seed and k — epochs follow one another, each in an order drawn from (seed, epoch) — so
// the checkpointed row counter is the whole data position and resume is exact, at any world
// size. Two sources: windows of a token stream (TokenRows, dataset.h) and samples of a JSONL
// file (SampleRows), one per row or packed.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/batch.h"

namespace ptrain {

class SampleSet;

// 0..n-1 in the order of epoch `epoch`: Fisher-Yates with a splitmix64 stream seeded by
// (seed, epoch), identical on every platform.
std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch);

// How full the rows are: real positions / (rows * seq_len).
struct RowFill {
  int64_t rows = 0;
  int64_t positions = 0;  // positions holding a sample's token (the rest is padding)
  int64_t trained = 0;    // positions whose target is trained
  double fraction(int64_t seq_len) const {
    return rows ? static_cast<double>(positions) / static_cast<double>(rows * seq_len) : 0.0;
  }
};

class RowSource {
 public:
  virtual ~RowSource() = default;
  virtual int64_t seq_len() const = 0;
  // Training rows first .. first+count-1 of the run, on the host.
  virtual Batch train_rows(uint64_t first, int64_t count) = 0;
  virtual RowFill train_fill() const = 0;  // of the first epoch
  // The validation rows, in a fixed order.
  virtual int64_t val_rows() const = 0;
  virtual Batch val_batch(int64_t first, int64_t count) const = 0;
  // Identifies the rows (the data and how it is cut into rows), kept in checkpoints so a resume
  // on other data is noticed.
  virtual std::string fingerprint() const = 0;
};

// Folds `n` values into a running splitmix64-based hash.
template <class T>
uint64_t hash_values(uint64_t h, const T* values, int64_t n);
// "KIND:<16 hex digits>".
std::string hex_fingerprint(const char* kind, uint64_t h);

// The validation samples: round(n * val_fraction) of them, at least one when val_fraction > 0
// and n >= 2, drawn with a fixed seed — the same for every run over the same file, whatever
// run.seed — and the rest for training; both in file order.
struct SampleSplit {
  std::vector<int64_t> train, val;
};
SampleSplit split_samples(int64_t n, double val_fraction);

// Samples as rows. Without packing each row holds one sample, padded. With packing, each
// epoch's order is packed first-fit into a window of kOpenRows open rows: a sample goes into
// the first open row it fits, else opens a row, the oldest open row being closed (emitted) when
// there are too many; a sample never spans two rows. Positions restart in each sample and
// attention stays inside it (Batch::doc_ids). A sample of n ids takes n-1 positions: inputs
// ids[0..n-2], targets ids[1..].
class SampleRows final : public RowSource {
 public:
  static constexpr int kOpenRows = 8;
  SampleRows(std::shared_ptr<const SampleSet> set, SampleSplit split, int64_t seq_len, uint64_t seed, bool packing);
  int64_t seq_len() const override { return seq_len_; }
  Batch train_rows(uint64_t first, int64_t count) override;
  RowFill train_fill() const override { return train_fill_; }
  int64_t val_rows() const override { return static_cast<int64_t>(val_.starts.size()) - 1; }
  Batch val_batch(int64_t first, int64_t count) const override;
  RowFill val_fill() const { return val_fill_; }
  std::string fingerprint() const override;
  const SampleSplit& split() const { return split_; }

 private:
  // Rows over `order`: row r holds samples[starts[r] .. starts[r+1]).
  struct Packed {
    std::vector<int64_t> samples, starts;
  };
  Packed pack(const std::vector<int64_t>& order) const;
  RowFill fill(const std::vector<int64_t>& samples, const std::vector<int64_t>& starts) const;
  void load_epoch(int64_t epoch);
  Batch rows(const std::vector<int64_t>& samples, const std::vector<int64_t>& starts,
             const std::vector<int64_t>& which) const;

  std::shared_ptr<const SampleSet> set_;
  SampleSplit split_;
  int64_t seq_len_;
  uint64_t seed_;
  bool packing_;
  std::vector<int64_t> rows_per_epoch_;  // rows of each epoch computed so far
  int64_t epoch_ = -1;                   // the epoch held below
  Packed held_rows_;                     // the held epoch's rows
  Packed val_;
  RowFill train_fill_, val_fill_;
};

// Preference pairs as rows: the set holds each pair as two samples, chosen (2k) then rejected
// (2k + 1) (SampleOptions::preference). Row k of the training order is pair k of the order (an
// epoch over the training pairs in the order epoch_order draws); a batch of `count` pairs is
// 2 * count rows, the chosen sequences first and then the rejected ones, each padded at its end
// (right padding: causal attention leaves the real positions as they are alone). The split is
// split_samples over the pairs.
class PairRows final : public RowSource {
 public:
  PairRows(std::shared_ptr<const SampleSet> set, SampleSplit split, int64_t seq_len, uint64_t seed);
  int64_t seq_len() const override { return seq_len_; }
  Batch train_rows(uint64_t first, int64_t count) override;
  RowFill train_fill() const override { return train_fill_; }  // counted in sequences (two a pair)
  int64_t val_rows() const override { return static_cast<int64_t>(split_.val.size()); }
  Batch val_batch(int64_t first, int64_t count) const override;
  RowFill val_fill() const { return val_fill_; }
  std::string fingerprint() const override;
  // The rows of these pairs (indices into the set's pairs), chosen rows first; Batch::pairs names them.
  Batch pair_batch(const std::vector<int64_t>& pairs) const;
  int64_t pairs() const;  // in the set, training and validation

 private:
  RowFill fill(const std::vector<int64_t>& pairs) const;
  std::shared_ptr<const SampleSet> set_;
  SampleSplit split_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;  // the held epoch's training pairs, in order
  RowFill train_fill_, val_fill_;
};

}  // namespace ptrain
