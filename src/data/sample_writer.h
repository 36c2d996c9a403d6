// How a SampleSet is made: a data file's records rendered block by block (several threads per
// block, the blocks appended in file order) into a SampleWriter, which keeps the per-sample
// index in memory and hands the ids and trained flags to where they are stored — vectors
// (SampleSet::from_jsonl) or a cache file (sample_cache.h). Internal to the data layer.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "data/samples.h"

namespace ptrain {

// Rendered samples of consecutive records, each already within max_ids and training something.
struct SampleBlock {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  std::vector<int64_t> lengths, lines, counts;  // per sample: ids, source line (row), trained targets
  SampleStats stats;                            // of the block's records
  std::string error;                            // the first bad record's "FILE:LINE: problem" when not skipped
};

class SampleWriter {
 public:
  virtual ~SampleWriter() = default;
  // Appends a block's samples (not its stats: render_samples adds those up).
  void append(const SampleBlock& block);
  int64_t samples() const { return static_cast<int64_t>(lines_.size()); }
  int64_t ids() const { return offsets_.back(); }

 protected:
  virtual void store(const SampleBlock& block) = 0;  // the block's ids and trained flags
  // A set over arrays `storage` keeps alive; the index and totals are this writer's.
  SampleSet assemble(std::string source, SampleStats stats, std::shared_ptr<const void> storage, const int32_t* ids,
                     const uint8_t* trained, const int64_t* offsets, const int64_t* lines, const int64_t* counts) const;
  // A set over arrays read back from storage, with the totals recorded alongside them.
  static SampleSet assemble(std::string source, SampleStats stats, std::shared_ptr<const void> storage,
                            const int32_t* ids, const uint8_t* trained, const int64_t* offsets, const int64_t* lines,
                            const int64_t* counts, int64_t n, int64_t total_trained, int32_t max_id, uint64_t hash);
  // `set` names its records as `file_format` numbers them (SampleSet::where).
  static SampleSet located(SampleSet set, DataFormat file_format) {
    set.separator_ = record_separator(file_format);
    return set;
  }

  std::vector<int64_t> offsets_{0}, lines_, counts_;
  int64_t total_trained_ = 0;
  int32_t max_id_ = -1;
  uint64_t hash_ = 0;
};

// Reads `path` (Parquet when `parquet`, else JSONL) in blocks, renders each block's records
// with options.threads threads and appends the block to `out`; returns the counts over the
// file. The samples and counts do not depend on the thread count. A malformed record throws
// RuntimeError naming FILE:LINE (FILE: row N) unless options.skip_bad_records.
SampleStats render_samples(const std::string& path, DataFormat file_format, const Tokenizer& tokenizer,
                           const ChatFormat& format, const SampleOptions& options, const SampleProgress& progress,
                           SampleWriter& out);

}  // namespace ptrain
