// The samples of a JSONL / Parquet file, tokenized once into a cache file and mapped read-only
// by later runs and by every rank (as HF `datasets` caches processed data in memory-mapped Arrow
// files). One file per key, `<cache dir>/<data file name>.<16 hex digits>.samples`; the key is a
// hash of everything the samples depend on:
//   - ptrain's version and this file format's version (a changed renderer renders anew),
//   - the data file: its absolute path, size, modification time and the CRC-32 of its first and
//     last MiB,
//   - the tokenizer.json's bytes, the chat format (template, its date), bos_token / eos_token,
//   - the data options: format, seq_len + 1, truncation, train_on_prompt, on_bad_record, fields.
// Layout (little-endian): ids (int32), trained flags (uint8), then per sample its offset (int64,
// n+1 of them), source line, trained-target count; a JSON record of the counts and the key's
// parts; and a fixed trailer — magic, version, key, sizes and the CRC-32 of every byte before
// it, verified before the file is used. Written through a temporary name and renamed, so a
// crash leaves no half file under the real name.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "common/error.h"
#include "data/samples.h"

namespace ptrain {

// The cache directory or file cannot be made or written (not a problem of the data).
struct CacheWriteError : RuntimeError {
  using RuntimeError::RuntimeError;
};

struct SampleCacheKey {
  uint64_t hash = 0;
  std::string path;                       // the cache file
  std::string parts;                      // what was hashed, as JSON (kept in the file)
  DataFormat format = DataFormat::jsonl;  // of the data file (part of the hash)
};

// $PTRAIN_DATA_CACHE, else $XDG_CACHE_HOME/ptrain/datasets, else $HOME/.cache/ptrain/datasets.
std::string default_sample_cache_dir();

// The key of `data_path`'s samples under `dir`. Throws RuntimeError when the data file cannot
// be read.
SampleCacheKey sample_cache_key(const std::string& dir, const std::string& data_path, DataFormat file_format,
                                const Tokenizer& tokenizer, const ChatFormat& format, const SampleOptions& options);

// The cached samples, mapped; nullopt when the file is absent, or — with the reason in
// `why_not` — when it is damaged (size, trailer, checksum, index) or not this key's.
std::optional<SampleSet> open_sample_cache(const SampleCacheKey& key, const std::string& data_path,
                                           std::string* why_not);

// Renders `data_path` (render_samples, options.threads threads) straight into the cache file —
// only one block of records is in memory at a time — then maps it. Throws RuntimeError as
// render_samples does, or CacheWriteError when the cache file cannot be written; nothing is left
// behind then.
SampleSet build_sample_cache(const SampleCacheKey& key, const std::string& data_path, DataFormat file_format,
                             const Tokenizer& tokenizer, const ChatFormat& format, const SampleOptions& options,
                             const SampleProgress& progress);

}  // namespace ptrain
