#include "data/dataset.h"

#include <ATen/ATen.h>

#include <cstring>

#include "common/error.h"
#include "common/fs_util.h"
#include "data/token_file.h"

namespace ptrain {

TokenData::TokenData(const std::string& path, const std::string& format) {
  size_t header = 0;
  if (format == "tokens") {
    TokenFileHeader h = read_token_header(path);
    header = kTokenHeaderBytes;
    token_bytes_ = static_cast<int>(h.token_bytes);
    count_ = static_cast<int64_t>(h.count);
    vocab_ = h.vocab_size;
  } else if (format != "text") {
    throw RuntimeError("unknown data format '" + format + "' (use text or tokens)");
  }
  map_ = std::make_shared<MappedFile>(path);
  if (map_->size() == 0) throw RuntimeError("data file '" + path + "' is empty");
  base_ = map_->data() + header;
  if (format == "text") count_ = static_cast<int64_t>(map_->size());
}

void TokenData::read(int64_t start, int64_t n, int64_t* out) const {
  TORCH_CHECK(start >= 0 && n >= 0 && start + n <= count_, "token range [", start, ", ", start + n,
              ") outside the data (", count_, " tokens)");
  const unsigned char* p = base_ + start * token_bytes_;
  for (int64_t i = 0; i < n; ++i, p += token_bytes_) {
    if (token_bytes_ == 1) {
      out[i] = *p;
    } else if (token_bytes_ == 2) {
      uint16_t v;
      std::memcpy(&v, p, 2);
      out[i] = v;
    } else {
      uint32_t v;
      std::memcpy(&v, p, 4);
      out[i] = v;
    }
  }
}

static int64_t val_tokens(const TokenData& data, double val_fraction, int64_t seq_len) {
  if (val_fraction <= 0) return 0;
  return std::max<int64_t>(seq_len + 1, static_cast<int64_t>(static_cast<double>(data.size()) * val_fraction));
}

Split train_split(const TokenData& data, double val_fraction, int64_t seq_len) {
  return {0, data.size() - val_tokens(data, val_fraction, seq_len)};
}

Split val_split(const TokenData& data, double val_fraction, int64_t seq_len) {
  return {data.size() - val_tokens(data, val_fraction, seq_len), data.size()};
}

WindowSampler::WindowSampler(Split split, int64_t seq_len, uint64_t seed)
    : split_(split), seq_len_(seq_len), seed_(seed), n_windows_((split.size() - 1) / seq_len) {
  if (n_windows_ < 1)
    throw RuntimeError("training split has " + std::to_string(split.size()) +
                       " tokens, fewer than one window of seq_len+1 = " + std::to_string(seq_len + 1));
}

int64_t WindowSampler::window_start(uint64_t k) {
  const int64_t epoch = static_cast<int64_t>(k / static_cast<uint64_t>(n_windows_));
  if (epoch != epoch_) {
    order_ = epoch_order(n_windows_, seed_, epoch);
    epoch_ = epoch;
  }
  return split_.begin + order_[k % static_cast<uint64_t>(n_windows_)] * seq_len_;
}

at::Tensor windows_at(const TokenData& data, const std::vector<int64_t>& starts, int64_t len) {
  at::Tensor out = at::empty({static_cast<int64_t>(starts.size()), len}, at::kLong);
  int64_t* p = out.data_ptr<int64_t>();
  for (size_t i = 0; i < starts.size(); ++i) data.read(starts[i], len, p + i * len);
  return out;
}

at::Tensor sample_batch(const TokenData& data, WindowSampler& sampler, uint64_t first, int64_t count, int64_t seq_len) {
  std::vector<int64_t> starts(count);
  for (int64_t i = 0; i < count; ++i) starts[i] = sampler.window_start(first + i);
  return windows_at(data, starts, seq_len + 1);
}

TokenRows::TokenRows(std::shared_ptr<const TokenData> data, Split train, Split val, int64_t seq_len, uint64_t seed)
    : data_(std::move(data)), train_(train), val_(val), seq_len_(seq_len) {
  if (train_.size() > 0) sampler_ = std::make_unique<WindowSampler>(train_, seq_len_, seed);
}

Batch TokenRows::train_rows(uint64_t first, int64_t count) {
  if (!sampler_) throw RuntimeError("no training split");
  return Batch::of_windows(sample_batch(*data_, *sampler_, first, count, seq_len_));
}

RowFill TokenRows::train_fill() const {
  const int64_t rows = sampler_ ? sampler_->windows_per_epoch() : 0;
  return {rows, rows * seq_len_, rows * seq_len_};
}

std::string TokenRows::fingerprint() const {
  const int64_t n = data_->size(), k = std::min<int64_t>(n, 65536);
  const int64_t shape[] = {n, seq_len_, train_.size(), val_.size()};
  std::vector<int64_t> ends(static_cast<size_t>(2 * k));
  data_->read(0, k, ends.data());
  data_->read(n - k, k, ends.data() + k);
  return hex_fingerprint("tokens", hash_values(hash_values(0, shape, 4), ends.data(), 2 * k));
}

Batch TokenRows::val_batch(int64_t first, int64_t count) const {
  std::vector<int64_t> starts;
  for (int64_t w = first; w < std::min(first + count, val_rows()); ++w)
    starts.push_back(val_.begin + w * (seq_len_ + 1));
  return Batch::of_windows(windows_at(*data_, starts, seq_len_ + 1));
}

}  // namespace ptrain
