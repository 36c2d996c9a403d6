// Training samples from a JSONL file (or the rows of a Parquet file), tokenized as the file is
// read: each line one record,
//   {"text": "..."}                        BOS text EOS (the tokenizer's document markers), all
//                                          trained
//   {"messages": [{"role", "content"}..]}   the model's chat template (chat.h); only the
//                                          assistant replies are trained
//   {"conversations": [{"from", "value"}..]} ShareGPT: from human / gpt / system (or user /
//                                          assistant), rendered as "messages"
//   {"instruction", "input", "output"}     Alpaca: one user turn (the instruction, then a blank
//                                          line and the input when there is one; a "system"
//                                          field before it), the output as the reply
//   {"prompt": "...", "completion": "..."}  BOS prompt completion EOS; the completion and EOS
//                                          are trained
// (`train_on_prompt` trains every token). A sample longer than `max_ids` is cut to its first
// `max_ids` ids or dropped; one with nothing left to train is dropped. Both are counted.
// A malformed record or an unknown role throws RuntimeError naming FILE:LINE.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "data/chat.h"

namespace ptrain {

class Tokenizer;

// The record fields a dataset names differently: canonical field -> its name in the data
// (data.fields, e.g. instruction -> "question"). Canonical fields: text, messages, role, content,
// conversations, from, value, instruction, input, output, system, prompt, completion.
using FieldNames = std::vector<std::pair<std::string, std::string>>;
const std::vector<std::string>& record_fields();

struct SampleOptions {
  int64_t max_ids = 0;  // seq_len + 1: the ids one row holds (its seq_len predictions)
  bool drop_too_long = false;
  bool train_on_prompt = false;
  bool skip_bad_records = false;  // data.on_bad_record = "skip": count and report them instead of stopping
  FieldNames fields;
};

struct SampleStats {
  int64_t records = 0;                                // non-blank lines
  int64_t text = 0, chat = 0, prompt_completion = 0;  // chat: messages, ShareGPT and Alpaca records
  int64_t truncated = 0;                              // kept, cut to max_ids
  int64_t dropped_too_long = 0;                       // data.truncation = "drop"
  int64_t skipped_bad = 0;                            // malformed records skipped (data.on_bad_record = "skip")
  std::string first_bad;                              // the first one's location and problem
  int64_t dropped_untrained = 0;                      // nothing trained (e.g. a chat without a reply, or cut before it)
};

class SampleSet {
 public:
  // `progress(bytes_done, bytes_total, ids)` every 1000 records and at the end.
  // from_parquet: each row of a Parquet file as the record its columns spell (parquet.h); errors
  // name FILE: row N; progress counts rows.
  static SampleSet from_parquet(const std::string& path, const Tokenizer& tokenizer, const ChatFormat& format,
                                const SampleOptions& options,
                                const std::function<void(int64_t, int64_t, int64_t)>& progress = nullptr);
  static SampleSet from_jsonl(const std::string& path, const Tokenizer& tokenizer, const ChatFormat& format,
                              const SampleOptions& options,
                              const std::function<void(int64_t, int64_t, int64_t)>& progress = nullptr);

  // Appends a sample (already within max_ids); returns false, counting it, when it trains nothing.
  bool add(const Sample& sample, int64_t line);

  int64_t size() const { return static_cast<int64_t>(lines_.size()); }
  int64_t length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }  // ids
  const int32_t* ids(int64_t i) const { return ids_.data() + offsets_[i]; }
  const uint8_t* trained(int64_t i) const { return trained_.data() + offsets_[i]; }
  int64_t line(int64_t i) const { return lines_[i]; }  // 1-based line of the source file
  int64_t total_ids() const { return static_cast<int64_t>(ids_.size()); }
  int64_t total_trained() const { return total_trained_; }  // trained targets over all samples
  int32_t max_id() const { return max_id_; }
  const std::string& source() const { return source_; }
  SampleStats stats;

 private:
  // Records with their location (`path` + `separator` + where[i] in errors) and progress marks.
  static SampleSet from_records(const std::string& path, const std::vector<std::string>& records,
                                const std::vector<int64_t>& where, const std::vector<int64_t>& done, int64_t total,
                                const std::string& separator, const Tokenizer& tok, const ChatFormat& format,
                                const SampleOptions& o, const std::function<void(int64_t, int64_t, int64_t)>& progress);
  std::string source_;
  std::vector<int32_t> ids_;
  std::vector<uint8_t> trained_;
  std::vector<int64_t> offsets_{0};
  std::vector<int64_t> lines_;
  int64_t total_trained_ = 0;
  int32_t max_id_ = -1;
};

// One JSONL record as a sample (before truncation). Throws RuntimeError (without location).
Sample render_record(const Tokenizer& tokenizer, const ChatFormat& format, const std::string& json_line,
                     bool train_on_prompt, SampleStats& stats, const FieldNames& fields = {});

}  // namespace ptrain
