// The data part's options, as the config's [data] section holds them: each field's initialiser
// is the key's default (docs/config.md shows them), in this one place. Validation: problems()
// (the section's own rules); config/validate.cpp holds those that read other sections or files.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

#include "common/check.h"
#include "tokenizer/chat.h"

namespace ptrain {

enum class DataFormat { text, tokens, jsonl, parquet, json };
// The formats' names as data.format spells them, in enumerator order.
const std::vector<std::string>& data_format_names();
// jsonl, json and parquet: records (text, chats, prompt/completion) rendered into samples with a loss mask.
inline bool holds_records(DataFormat f) {
  return f == DataFormat::jsonl || f == DataFormat::parquet || f == DataFormat::json;
}
enum class Truncation { truncate, drop };
enum class BadRecord { error, skip };

// [data]
struct DataOptions {
  std::string path;  // text file (byte-level tokens), .bin token file or .jsonl records
  DataFormat format = DataFormat::text;
  std::string tokenizer;                   // jsonl: tokenizer.json or its directory (default: model.hf_path)
  std::vector<std::string> fields;         // jsonl/parquet: "canonical=theirs" field names ("output=answer")
  std::vector<std::string> ignore_fields;  // jsonl/parquet: fields (columns) left out knowingly, as the data names them
  BadRecord on_bad_record = BadRecord::error;  // jsonl/parquet: stop at a malformed record, or skip and count it
  ChatTemplate chat_template = ChatTemplate::automatic;  // jsonl chats: the template (auto: the tokenizer directory's)
  bool packing = false;                                  // jsonl: several samples per row
  bool train_on_prompt = false;                  // jsonl: train on prompts too, not only on replies / completions
  Truncation truncation = Truncation::truncate;  // jsonl: samples longer than a row
  bool cache = true;                             // jsonl/parquet: tokenize once into a mapped cache file
  std::string cache_dir;                         // where (default: $PTRAIN_DATA_CACHE or ~/.cache/ptrain/datasets)
  int64_t seq_len = 128;                         // tokens per training sequence
  int64_t micro_batch_size = 8;                  // sequences per forward/backward per rank
  double val_fraction = 0.05;                    // held out for validation: the tail of a token stream; jsonl: samples
  OptionProblems problems() const;               // micro-batch size, validation share (files: config/validate.cpp)
};

}  // namespace ptrain
