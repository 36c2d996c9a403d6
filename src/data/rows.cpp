#include "data/rows.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <deque>

#include "common/error.h"
#include "common/hash.h"
#include "data/samples.h"
#include "model/loss.h"

namespace ptrain {

namespace {
constexpr uint64_t kSplitSeed = 0x7A1D5EEDull;  // the train/val draw: fixed, not run.seed
}  // namespace

std::vector<int64_t> epoch_order(int64_t n, uint64_t seed, int64_t epoch) {
  std::vector<int64_t> order(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) order[i] = i;
  uint64_t state = seed ^ (0xD1B54A32D192ED03ull * static_cast<uint64_t>(epoch + 1));
  for (int64_t i = n - 1; i > 0; --i) {
    const int64_t j = static_cast<int64_t>(mix64(state += kGolden64) % static_cast<uint64_t>(i + 1));
    std::swap(order[i], order[j]);
  }
  return order;
}

template <class T>
uint64_t hash_values(uint64_t h, const T* values, int64_t n) {
  for (int64_t i = 0; i < n; ++i) h = mix64(h ^ (static_cast<uint64_t>(values[i]) + kGolden64));
  return h;
}
template uint64_t hash_values<int32_t>(uint64_t, const int32_t*, int64_t);
template uint64_t hash_values<uint8_t>(uint64_t, const uint8_t*, int64_t);
template uint64_t hash_values<int64_t>(uint64_t, const int64_t*, int64_t);
template uint64_t hash_values<uint64_t>(uint64_t, const uint64_t*, int64_t);

std::string hex_fingerprint(const char* kind, uint64_t h) {
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return std::string(kind) + ":" + buf;
}

SampleSplit split_samples(int64_t n, double val_fraction) {
  int64_t n_val = static_cast<int64_t>(std::llround(static_cast<double>(n) * val_fraction));
  if (val_fraction > 0 && n >= 2) n_val = std::max<int64_t>(n_val, 1);
  n_val = std::min(n_val, n - 1);
  if (n_val < 0) n_val = 0;
  const std::vector<int64_t> order = epoch_order(n, kSplitSeed, 0);
  SampleSplit s;
  s.val.assign(order.begin(), order.begin() + n_val);
  s.train.assign(order.begin() + n_val, order.end());
  std::sort(s.val.begin(), s.val.end());
  std::sort(s.train.begin(), s.train.end());
  return s;
}

SampleRows::SampleRows(std::shared_ptr<const SampleSet> set, SampleSplit split, int64_t seq_len, uint64_t seed,
                       bool packing)
    : set_(std::move(set)), split_(std::move(split)), seq_len_(seq_len), seed_(seed), packing_(packing) {
  for (int64_t i = 0; i < set_->size(); ++i)
    if (set_->length(i) - 1 > seq_len_)
      throw RuntimeError(set_->where(i) + ": a sample of " + std::to_string(set_->length(i)) +
                         " ids does not fit a row of seq_len " + std::to_string(seq_len_));
  val_ = pack(split_.val);
  val_fill_ = fill(val_.samples, val_.starts);
  if (!split_.train.empty()) {
    load_epoch(0);
    train_fill_ = fill(held_rows_.samples, held_rows_.starts);
  }
}

SampleRows::Packed SampleRows::pack(const std::vector<int64_t>& order) const {
  Packed p;
  p.starts.push_back(0);
  if (!packing_) {
    p.samples = order;
    for (size_t i = 0; i < order.size(); ++i) p.starts.push_back(static_cast<int64_t>(i) + 1);
    return p;
  }
  struct Open {
    std::vector<int64_t> members;
    int64_t used = 0;
  };
  std::deque<Open> open;
  auto emit = [&] {
    p.samples.insert(p.samples.end(), open.front().members.begin(), open.front().members.end());
    p.starts.push_back(static_cast<int64_t>(p.samples.size()));
    open.pop_front();
  };
  for (int64_t s : order) {
    const int64_t n = set_->length(s) - 1;
    auto row = std::find_if(open.begin(), open.end(), [&](const Open& o) { return o.used + n <= seq_len_; });
    if (row != open.end()) {
      row->members.push_back(s);
      row->used += n;
      continue;
    }
    if (static_cast<int>(open.size()) == kOpenRows) emit();
    open.push_back({{s}, n});
  }
  while (!open.empty()) emit();
  return p;
}

RowFill SampleRows::fill(const std::vector<int64_t>& samples, const std::vector<int64_t>& starts) const {
  RowFill f;
  f.rows = static_cast<int64_t>(starts.size()) - 1;
  for (int64_t s : samples) {
    f.positions += set_->length(s) - 1;
    f.trained += set_->trained_count(s);
  }
  return f;
}

void SampleRows::load_epoch(int64_t epoch) {
  if (epoch == epoch_) return;
  const std::vector<int64_t> order = epoch_order(static_cast<int64_t>(split_.train.size()), seed_, epoch);
  std::vector<int64_t> samples(order.size());
  for (size_t i = 0; i < order.size(); ++i) samples[i] = split_.train[order[i]];
  held_rows_ = pack(samples);
  epoch_ = epoch;
  if (static_cast<int64_t>(rows_per_epoch_.size()) == epoch)
    rows_per_epoch_.push_back(static_cast<int64_t>(held_rows_.starts.size()) - 1);
}

Batch SampleRows::train_rows(uint64_t first, int64_t count) {
  if (split_.train.empty()) throw RuntimeError(set_->source() + ": no training samples");
  std::vector<std::pair<int64_t, int64_t>> where;  // (epoch, row) of each requested row
  for (int64_t r = 0; r < count; ++r) {
    auto k = static_cast<int64_t>(first) + r;
    int64_t epoch = 0;
    for (;; ++epoch) {
      if (epoch >= static_cast<int64_t>(rows_per_epoch_.size())) load_epoch(epoch);  // counts its rows
      if (k < rows_per_epoch_[epoch]) break;
      k -= rows_per_epoch_[epoch];
    }
    where.emplace_back(epoch, k);
  }
  // The rows of one batch lie in at most two epochs; gather them epoch by epoch.
  std::vector<Batch> parts;
  for (size_t i = 0; i < where.size();) {
    load_epoch(where[i].first);
    std::vector<int64_t> which;
    size_t j = i;
    for (; j < where.size() && where[j].first == where[i].first; ++j) which.push_back(where[j].second);
    parts.push_back(rows(held_rows_.samples, held_rows_.starts, which));
    i = j;
  }
  if (parts.size() == 1) return parts[0];
  std::vector<at::Tensor> in, tg, dc;
  for (auto& p : parts) {
    in.push_back(p.inputs);
    tg.push_back(p.targets);
    if (p.doc_ids.defined()) dc.push_back(p.doc_ids);
  }
  int64_t num_tokens = 0;
  for (const auto& p : parts) num_tokens += p.num_tokens;
  return {at::cat(in), at::cat(tg), dc.empty() ? at::Tensor() : at::cat(dc), at::Tensor(), at::Tensor(), num_tokens};
}

std::string SampleRows::fingerprint() const {
  const int64_t shape[] = {seq_len_, packing_ ? 1 : 0, static_cast<int64_t>(split_.train.size()), set_->size()};
  const uint64_t content = set_->content_hash();  // every sample's ids and flags, hashed as they were rendered
  return hex_fingerprint("samples", hash_values(hash_values(0, shape, 4), &content, 1));
}

Batch SampleRows::val_batch(int64_t first, int64_t count) const {
  std::vector<int64_t> which;
  for (int64_t r = first; r < std::min(first + count, val_rows()); ++r) which.push_back(r);
  return rows(val_.samples, val_.starts, which);
}

Batch SampleRows::rows(const std::vector<int64_t>& samples, const std::vector<int64_t>& starts,
                       const std::vector<int64_t>& which) const {
  const auto B = static_cast<int64_t>(which.size());
  const int64_t T = seq_len_;
  at::Tensor inputs = at::zeros({B, T}, at::kLong), targets = at::full({B, T}, kIgnoreIndex, at::kLong);
  at::Tensor docs = packing_ ? at::empty({B, T}, at::kLong) : at::Tensor();
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* tg = targets.data_ptr<int64_t>();
  int64_t* dc = packing_ ? docs.data_ptr<int64_t>() : nullptr;
  int64_t num_tokens = 0;
  for (int64_t b = 0; b < B; ++b) {
    int64_t pos = b * T, doc = 0;
    for (int64_t i = starts[which[b]]; i < starts[which[b] + 1]; ++i, ++doc) {
      const int64_t s = samples[i], n = set_->length(s);
      num_tokens += n;
      const int32_t* ids = set_->ids(s);
      const uint8_t* trained = set_->trained(s);
      for (int64_t t = 0; t + 1 < n; ++t, ++pos) {
        in[pos] = ids[t];
        if (trained[t + 1]) tg[pos] = ids[t + 1];
        if (dc) dc[pos] = doc;
      }
    }
    if (dc)
      for (; pos < (b + 1) * T; ++pos) dc[pos] = doc;  // padding: a document of its own
  }
  return {inputs, targets, docs, at::Tensor(), at::Tensor(), num_tokens};
}

PairRows::PairRows(std::shared_ptr<const SampleSet> set, SampleSplit split, int64_t seq_len, uint64_t seed)
    : set_(std::move(set)), split_(std::move(split)), seq_len_(seq_len), seed_(seed) {
  for (int64_t i = 0; i < set_->size(); ++i)
    if (set_->length(i) - 1 > seq_len_)
      throw RuntimeError(set_->where(i) + ": a sequence of " + std::to_string(set_->length(i)) +
                         " ids does not fit a row of seq_len " + std::to_string(seq_len_));
  train_fill_ = fill(split_.train);
  val_fill_ = fill(split_.val);
}

int64_t PairRows::pairs() const { return set_->size() / 2; }

RowFill PairRows::fill(const std::vector<int64_t>& pairs) const {
  RowFill f;
  for (int64_t p : pairs)
    for (int64_t s : {2 * p, 2 * p + 1}) {
      ++f.rows;
      f.positions += set_->length(s) - 1;
      f.trained += set_->trained_count(s);
    }
  return f;
}

Batch PairRows::train_rows(uint64_t first, int64_t count) {
  const auto n = static_cast<int64_t>(split_.train.size());
  if (n == 0) throw RuntimeError(set_->source() + ": no training pairs");
  std::vector<int64_t> pairs;
  for (int64_t r = 0; r < count; ++r) {
    const auto k = static_cast<int64_t>(first) + r;
    if (k / n != epoch_) {
      epoch_ = k / n;
      order_ = epoch_order(n, seed_, epoch_);
    }
    pairs.push_back(split_.train[order_[k % n]]);
  }
  return pair_batch(pairs);
}

Batch PairRows::val_batch(int64_t first, int64_t count) const {
  std::vector<int64_t> pairs;
  for (int64_t r = first; r < std::min(first + count, val_rows()); ++r) pairs.push_back(split_.val[r]);
  return pair_batch(pairs);
}

Batch PairRows::pair_batch(const std::vector<int64_t>& pairs) const {
  const auto P = static_cast<int64_t>(pairs.size());
  const int64_t T = seq_len_;
  at::Tensor inputs = at::zeros({2 * P, T}, at::kLong), targets = at::full({2 * P, T}, kIgnoreIndex, at::kLong);
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* tg = targets.data_ptr<int64_t>();
  int64_t num_tokens = 0;
  for (int64_t b = 0; b < 2 * P; ++b) {
    const int64_t s = 2 * pairs[b % P] + (b < P ? 0 : 1), n = set_->length(s);
    num_tokens += n;
    const int32_t* ids = set_->ids(s);
    const uint8_t* trained = set_->trained(s);
    for (int64_t t = 0; t + 1 < n; ++t) {
      in[b * T + t] = ids[t];
      if (trained[t + 1]) tg[b * T + t] = ids[t + 1];
    }
  }
  return {inputs, targets, at::Tensor(), at::tensor(pairs, at::kLong), at::Tensor(), num_tokens};
}

std::string PairRows::fingerprint() const {
  const int64_t shape[] = {seq_len_, 2, static_cast<int64_t>(split_.train.size()), set_->size()};
  const uint64_t content = set_->content_hash();
  return hex_fingerprint("pairs", hash_values(hash_values(0, shape, 4), &content, 1));
}

namespace {
constexpr int64_t kUnpairBlock = 1000;  // the records TRL's unpair_preference_dataset maps at a time
}  // namespace

int64_t kto_records(const SampleSet& set) {
  int64_t n = 0;
  for (int64_t i = 0; i < set.size(); ++i) n += i == 0 || set.line(i) != set.line(i - 1) ? 1 : 0;
  return n;
}

KtoRows::KtoRows(std::shared_ptr<const SampleSet> set, const SampleSplit& split, int64_t seq_len, int64_t max_ids,
                 int64_t micro_batch)
    : set_(std::move(set)), seq_len_(seq_len), max_ids_(max_ids), micro_batch_(std::max<int64_t>(micro_batch, 1)) {
  if (max_ids_ - 1 > seq_len_)
    throw RuntimeError("KTO rows of " + std::to_string(max_ids_) + " ids do not fit seq_len " +
                       std::to_string(seq_len_));
  for (int64_t i = 0; i < set_->size(); ++i) {
    if (!records_.empty() && set_->line(records_.back().first) == set_->line(i))
      ++records_.back().second;
    else
      records_.emplace_back(i, 1);
  }
  train_ = examples_of(split.train);
  val_ = examples_of(split.val);
  for (const Example& e : train_) {
    const int64_t prompt = prompt_ids(e.sample);
    train_desirable_ += set_->trained(e.sample)[prompt] == kDesirable ? 1 : 0;
    for (int64_t ids : {set_->length(e.sample), prompt + set_->length(e.kl) - prompt_ids(e.kl)}) {
      const int64_t n = std::min(ids, max_ids_);
      ++train_fill_.rows;
      train_fill_.positions += n - 1;
      train_fill_.trained += n - prompt;
    }
  }
}

int64_t KtoRows::prompt_ids(int64_t sample) const {
  const uint8_t* trained = set_->trained(sample);
  int64_t n = 1;
  while (n < set_->length(sample) && trained[n] == 0) ++n;
  return n;
}

std::vector<KtoRows::Example> KtoRows::examples_of(const std::vector<int64_t>& records) {
  std::vector<int64_t> samples;  // in TRL's order: paired records unpaired a thousand at a time
  for (size_t first = 0; first < records.size(); first += kUnpairBlock) {
    const size_t end = std::min(records.size(), first + kUnpairBlock);
    for (int64_t side = 0; side < 2; ++side)
      for (size_t r = first; r < end; ++r) {
        const auto [sample, count] = records_[static_cast<size_t>(records[r])];
        if (side < count) samples.push_back(sample + side);
      }
  }
  std::vector<Example> out;
  for (int64_t s : samples) {
    if (prompt_ids(s) >= max_ids_) {
      ++dropped_;
      continue;
    }
    out.push_back({s, s});
  }
  // the KL completions: each block's completions rotated by one
  const auto n = static_cast<int64_t>(out.size());
  std::vector<int64_t> own(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) own[static_cast<size_t>(i)] = out[static_cast<size_t>(i)].sample;
  for (int64_t block = 0; block < n; block += micro_batch_) {
    const int64_t end = std::min(n, block + micro_batch_);
    for (int64_t i = block; i < end; ++i)
      out[static_cast<size_t>(i)].kl = own[static_cast<size_t>(i == block ? end - 1 : i - 1)];
  }
  for (const Example& e : out) {
    truncated_ += set_->length(e.sample) > max_ids_ ? 1 : 0;
    truncated_ += prompt_ids(e.sample) + set_->length(e.kl) - prompt_ids(e.kl) > max_ids_ ? 1 : 0;
  }
  return out;
}

Batch KtoRows::train_rows(uint64_t first, int64_t count) {
  const auto n = static_cast<int64_t>(train_.size());
  if (n == 0) throw RuntimeError(set_->source() + ": no training examples");
  if (count != micro_batch_ || first % static_cast<uint64_t>(count) != 0)
    throw RuntimeError("KTO reads whole micro-batches of " + std::to_string(micro_batch_) + " examples");
  // micro-batch g is KL block g mod blocks: an epoch's last block may hold fewer examples
  const int64_t blocks = (n + micro_batch_ - 1) / micro_batch_;
  const int64_t block = static_cast<int64_t>((first / static_cast<uint64_t>(count)) % static_cast<uint64_t>(blocks));
  std::vector<int64_t> examples;
  for (int64_t k = block * micro_batch_; k < std::min(n, (block + 1) * micro_batch_); ++k) examples.push_back(k);
  return pair_batch(examples);
}

Batch KtoRows::val_batch(int64_t first, int64_t count) const {
  std::vector<int64_t> examples;
  for (int64_t r = first; r < std::min(first + count, val_rows()); ++r)
    examples.push_back(static_cast<int64_t>(train_.size()) + r);
  return pair_batch(examples);
}

Batch KtoRows::pair_batch(const std::vector<int64_t>& examples) const {
  const auto B = static_cast<int64_t>(examples.size());
  const int64_t T = seq_len_;
  at::Tensor inputs = at::zeros({2 * B, T}, at::kLong), targets = at::full({2 * B, T}, kIgnoreIndex, at::kLong);
  at::Tensor labels = at::zeros({B}, at::kBool);
  int64_t* in = inputs.data_ptr<int64_t>();
  int64_t* tg = targets.data_ptr<int64_t>();
  bool* label = labels.data_ptr<bool>();
  int64_t num_tokens = 0;
  const auto n_train = static_cast<int64_t>(train_.size());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t k = examples[static_cast<size_t>(b)];
    const Example& e = k < n_train ? train_[static_cast<size_t>(k)] : val_[static_cast<size_t>(k - n_train)];
    const int64_t prompt = prompt_ids(e.sample);
    label[b] = set_->trained(e.sample)[prompt] == kDesirable;
    // row b: the example; row B + b: its prompt and the KL completion; the first max_ids ids
    for (int64_t side = 0; side < 2; ++side) {
      std::vector<int32_t> ids;
      ids.insert(ids.end(), set_->ids(e.sample), set_->ids(e.sample) + prompt);
      const int64_t from = side == 0 ? e.sample : e.kl, start = side == 0 ? prompt : prompt_ids(e.kl);
      ids.insert(ids.end(), set_->ids(from) + start, set_->ids(from) + set_->length(from));
      const auto n = std::min<int64_t>(static_cast<int64_t>(ids.size()), max_ids_);
      if (side == 0) num_tokens += n;
      const int64_t row = side * B + b;
      for (int64_t t = 0; t + 1 < n; ++t) {
        in[row * T + t] = ids[static_cast<size_t>(t)];
        if (t + 1 >= prompt) tg[row * T + t] = ids[static_cast<size_t>(t + 1)];
      }
    }
  }
  return {inputs, targets, at::Tensor(), at::tensor(examples, at::kLong), labels, num_tokens};
}

std::string KtoRows::fingerprint() const {
  const int64_t shape[] = {seq_len_, max_ids_, micro_batch_, static_cast<int64_t>(train_.size()), set_->size()};
  const uint64_t content = set_->content_hash();
  return hex_fingerprint("kto", hash_values(hash_values(0, shape, 5), &content, 1));
}

}  // namespace ptrain
