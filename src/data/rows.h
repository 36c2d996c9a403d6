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

// Rows of preference examples, each two rows (PairRows: a pair's chosen and rejected; KtoRows: an
// example and its KL completion), that a reference scores once (precompute_ref_log_probs).
class PairedRows : public RowSource {
 public:
  // The rows of these examples (indices in [0, pairs())), the first row of each first, then the
  // second ones; Batch::pairs names them.
  virtual Batch pair_batch(const std::vector<int64_t>& pairs) const = 0;
  virtual int64_t pairs() const = 0;  // training and validation
};

// Preference pairs as rows: the set holds each pair as two samples, chosen (2k) then rejected
// (2k + 1) (SampleOptions::preference). Row k of the training order is pair k of the order (an
// epoch over the training pairs in the order epoch_order draws); a batch of `count` pairs is
// 2 * count rows, the chosen sequences first and then the rejected ones, each padded at its end
// (right padding: causal attention leaves the real positions as they are alone). The split is
// split_samples over the pairs.
class PairRows final : public PairedRows {
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
  Batch pair_batch(const std::vector<int64_t>& pairs) const override;
  int64_t pairs() const override;  // in the set, training and validation

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

// KTO's examples as rows, as TRL 1.16's KTOTrainer orders, pairs and cuts them. The set holds each
// example whole, its trained flags its label (data/samples.h render_kto); a record is one example,
// or a paired record's two (chosen, rejected). The split (split_samples) is over records. Each
// side's examples are its records' in file order — paired records unpaired as TRL's
// unpair_preference_dataset maps them, 1000 records at a time (datasets' map batch), the chosen
// completions of each thousand before their rejected ones —, less those whose prompt alone fills
// max_ids (dropped, as TRL drops them). An example's KL completion is the completion of the
// example before it in its block of `micro_batch` examples (the block's first takes its last),
// blocks counted from each side's first example: TRL's rotation. Training reads the blocks in
// order, micro-batch g (row first / micro_batch) the block g mod the epoch's blocks — TRL's
// sequential sampling, which keeps the KL pairs the micro-batches' own; an epoch's last block may
// hold fewer examples, as TRL's last batch. A batch of `count` examples is 2 * count rows: each example's prompt and
// completion, then its prompt and KL completion, each cut to its first max_ids ids (keep_start)
// and padded; Batch::pairs names the examples (training ones first, then validation ones),
// Batch::labels their labels.
// The records of a KTO set: runs of samples from one record (one, or a paired record's two).
int64_t kto_records(const SampleSet& set);

class KtoRows final : public PairedRows {
 public:
  // The records' split `split`; rows of seq_len positions hold max_ids ids (<= seq_len + 1).
  KtoRows(std::shared_ptr<const SampleSet> set, const SampleSplit& split, int64_t seq_len, int64_t max_ids,
          int64_t micro_batch);
  int64_t seq_len() const override { return seq_len_; }
  Batch train_rows(uint64_t first, int64_t count) override;
  RowFill train_fill() const override { return train_fill_; }  // counted in sequences (two an example)
  int64_t val_rows() const override { return static_cast<int64_t>(val_.size()); }
  Batch val_batch(int64_t first, int64_t count) const override;
  std::string fingerprint() const override;
  Batch pair_batch(const std::vector<int64_t>& examples) const override;
  int64_t pairs() const override { return static_cast<int64_t>(train_.size() + val_.size()); }
  int64_t train_examples() const { return static_cast<int64_t>(train_.size()); }
  int64_t train_desirable() const { return train_desirable_; }  // of the training examples
  int64_t records() const { return static_cast<int64_t>(records_.size()); }
  // Examples dropped (their prompt fills max_ids) and cut to max_ids, each side's KL rows included.
  int64_t dropped_prompt_fills() const { return dropped_; }
  int64_t truncated() const { return truncated_; }

 private:
  struct Example {
    int64_t sample, kl;  // the set's samples: the example's, and its KL completion's
  };
  std::vector<Example> examples_of(const std::vector<int64_t>& records);
  int64_t prompt_ids(int64_t sample) const;  // ids before the completion
  std::shared_ptr<const SampleSet> set_;
  int64_t seq_len_, max_ids_, micro_batch_;
  std::vector<std::pair<int64_t, int64_t>> records_;  // each record's first sample and its count
  std::vector<Example> train_, val_;
  int64_t dropped_ = 0, truncated_ = 0, train_desirable_ = 0;
  RowFill train_fill_;
};

}  // namespace ptrain
