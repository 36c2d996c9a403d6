// Token sources and deterministic sampling.
//
// TokenData maps a text file (byte-level: each byte is a token, vocab 256) or a token file
// (token_file.h) read-only. The last val_fraction of tokens is the validation split.
// Training windows have seq_len+1 tokens and start every seq_len tokens; each epoch visits
// all of them in an order drawn from (seed, epoch). Sample k of the run is a pure function
// of (seed, k), so a run resumes exactly from its sample counter and any world size can take
// its slice of the same global order.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/rows.h"

namespace ptrain {

class MappedFile;

class TokenData {
 public:
  // format: "text" or "tokens". Throws RuntimeError for missing/corrupt files.
  TokenData(const std::string& path, const std::string& format);
  int64_t size() const { return count_; }
  uint32_t vocab_size() const { return vocab_; }
  // Tokens [start, start+n) as int64 into out.
  void read(int64_t start, int64_t n, int64_t* out) const;

 private:
  std::shared_ptr<const MappedFile> map_;
  const unsigned char* base_ = nullptr;
  int64_t count_ = 0;
  int token_bytes_ = 1;
  uint32_t vocab_ = 256;
};

struct Split {
  int64_t begin = 0;  // token range [begin, end) of the data
  int64_t end = 0;
  int64_t size() const { return end - begin; }
};
// Train takes the head, validation the tail (at least one window when val_fraction > 0).
Split train_split(const TokenData& data, double val_fraction, int64_t seq_len);
Split val_split(const TokenData& data, double val_fraction, int64_t seq_len);

class WindowSampler {
 public:
  WindowSampler(Split split, int64_t seq_len, uint64_t seed);
  int64_t windows_per_epoch() const { return n_windows_; }
  // First token of global sample k.
  int64_t window_start(uint64_t k);

 private:
  Split split_;
  int64_t seq_len_;
  uint64_t seed_;
  int64_t n_windows_;
  int64_t epoch_ = -1;
  std::vector<int64_t> order_;
};

// [count, seq_len+1] int64 tensor of samples first..first+count-1.
at::Tensor sample_batch(const TokenData& data, WindowSampler& sampler, uint64_t first, int64_t count, int64_t seq_len);
// [count, len] int64 tensor of windows at the given token starts.
at::Tensor windows_at(const TokenData& data, const std::vector<int64_t>& starts, int64_t len);

// A token stream as rows: training windows from `train` (WindowSampler), and validation
// windows that tile `val` without overlap, in order: window i covers tokens
// [val.begin + i*(seq_len+1), +seq_len+1) and predicts its last seq_len from the ones before.
// An empty `train` serves validation only (`ptrain eval`).
class TokenRows final : public RowSource {
 public:
  TokenRows(std::shared_ptr<const TokenData> data, Split train, Split val, int64_t seq_len, uint64_t seed);
  int64_t seq_len() const override { return seq_len_; }
  Batch train_rows(uint64_t first, int64_t count) override;
  RowFill train_fill() const override;
  int64_t val_rows() const override { return val_.size() / (seq_len_ + 1); }
  Batch val_batch(int64_t first, int64_t count) const override;
  // The token count, seq_len and the first and last 64Ki tokens (a whole-file hash would cost a
  // read of every token at each start).
  std::string fingerprint() const override;

 private:
  std::shared_ptr<const TokenData> data_;
  Split train_, val_;
  int64_t seq_len_;
  std::unique_ptr<WindowSampler> sampler_;
};

}  // namespace ptrain
