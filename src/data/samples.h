// Training samples from a JSONL file (or the rows of a Parquet file), tokenized as the file is
// read: each line one record,
//   {"text": "..."}                        as TRL's SFTTrainer: HF's tokenizer(text + eos_token)
//                                          (its post-processor's special tokens, e.g. BOS; the
//                                          eos_token added unless the text ends with it), all
//                                          trained
//   {"messages": [{"role", "content"}..]}   the model's chat template (chat.h); only the
//   (and "tools": [...])                   assistant replies are trained; tools, tool calls and
//                                          tool results with Qwen2.5's and Qwen3's templates
//   {"conversations": [{"from", "value"}..]} ShareGPT: from human / gpt / system (or user /
//                                          assistant), rendered as "messages"
//   {"instruction", "input", "output"}     Alpaca: one user turn (the instruction, then a blank
//                                          line and the input when there is one; a "system"
//                                          field before it), the output as the reply
//   {"prompt": "...", "completion": "..."}  as TRL's SFTTrainer: tokenizer(prompt) and
//                                          tokenizer(prompt + completion + eos_token); trained
//                                          from where the two first differ
// (`train_on_prompt` trains every token). A sample longer than `max_ids` is cut to its first
// `max_ids` ids or dropped; one with nothing left to train is dropped. Both are counted.
// A malformed record or an unknown role throws RuntimeError naming FILE:LINE.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "data/options.h"
#include "tokenizer/chat.h"

namespace ptrain {

class Tokenizer;

// The record fields a dataset names differently: canonical field -> its name in the data
// (data.fields, e.g. instruction -> "question"). Canonical fields: text, messages, role, content,
// conversations, from, value, instruction, input, output, system, history, prompt, completion.
using FieldNames = std::vector<std::pair<std::string, std::string>>;
const std::vector<std::string>& record_fields();

// A "messages" list as chat turns: each {"role", "content"} (and a reply's "reasoning_content"),
// strings; a reply's "tool_calls" (its content then may be null or absent) and "tool" messages
// (tool results; their "tool_call_id" and "name" are not rendered); any other field of a turn is
// refused by name (RuntimeError, without location). Keys in their order (tool arguments render as written).
std::vector<ChatMessage> chat_turns(const nlohmann::ordered_json& messages);
// A record's "tools" (absent, null, a list of tool definitions or a string holding one, as TRL
// decodes it), each as the template's `tojson` renders it; `line` is the record's JSON text, checked
// for integers wider than 64 bits where there are tools. RuntimeError for anything else.
ChatTools chat_tools(const nlohmann::ordered_json& record, const std::string& line);

// A text record met with a tokenizer that names no eos_token (TrlTokenization::eos ""): the run's
// problem, never a malformed record — data.on_bad_record = "skip" does not skip it.
struct NoEosToken : RuntimeError {
  using RuntimeError::RuntimeError;
};

// How TRL's trainers tokenize text (not chats), with the tokenizer's bos_token and eos_token as
// transformers resolves them ("" for none; a text record or completion needs an eos_token):
// SFTTrainer's text and prompt/completion records, preference records as its DPOTrainer does
// (training.objective dpo) or as its CPOTrainer does (`cpo`: simpo and cpo), KTO's as KTOTrainer.
struct TrlTokenization {
  bool cpo = false;
  std::string bos, eos;
  bool kto = false;  // TRL's KTOTrainer: its examples (render_kto)
};

struct SampleOptions {
  int64_t max_ids = 0;  // seq_len + 1: the ids one row holds (its seq_len predictions)
  bool drop_too_long = false;
  bool train_on_prompt = false;
  bool skip_bad_records = false;  // data.on_bad_record = "skip": count and report them instead of stopping
  FieldNames fields;
  std::vector<std::string> ignore_fields;  // data.ignore_fields: left out of records and turns, as the data names them
  // Preference records ({prompt, chosen, rejected}: render_preference): each record becomes two
  // samples, chosen then rejected, cut as TRL's DPO collator cuts them (below).
  bool preference = false;
  TrlTokenization trl;
  int threads = 1;  // records rendered by this many threads at once (the result does not depend on it)
  int64_t block_bytes = int64_t{16} << 20;  // a JSONL file is read this many bytes of whole lines at a time
};

struct SampleStats {
  int64_t records = 0;                                // non-blank lines
  int64_t text = 0, chat = 0, prompt_completion = 0;  // chat: messages, ShareGPT and Alpaca records
  int64_t truncated = 0;                              // kept, cut to max_ids
  int64_t dropped_too_long = 0;                       // data.truncation = "drop"
  int64_t skipped_bad = 0;                            // malformed records skipped (data.on_bad_record = "skip")
  std::string first_bad;                              // the first one's location and problem
  int64_t dropped_untrained = 0;                      // nothing trained (e.g. a chat without a reply, or cut before it)
  int64_t reasoning_dropped = 0;  // chat replies whose reasoning the template leaves out (replies_losing_reasoning)
  int64_t call_text_dropped = 0;  // replies whose text beside a tool call the template leaves out (Llama 3.1's, Nemo's)
  // Preference records (pairs): truncated / dropped_too_long count pairs; these count the pairs
  // whose prompt alone fills max_ids (dropped, as TRL drops them) and whose tokenized prompt is
  // not a prefix of prompt + completion (the completion starts where they part, as in TRL; also
  // counted for SFT's text prompt/completion records).
  int64_t pairs = 0, dropped_prompt_fills = 0, prompt_diverged = 0;
  // KTO (render_kto): its examples, desirable or not (pairs: the paired records among them;
  // prompt_diverged counts examples)
  int64_t desirable = 0, undesirable = 0;
};

// `progress(done, total, ids)` after each block of records and at the end: bytes of a JSONL
// file, rows of a Parquet file.
using SampleProgress = std::function<void(int64_t, int64_t, int64_t)>;

// The samples of a data file: ids, which targets are trained, and where each sample came from.
// Held in memory (from_file) or mapped read-only from a cache file written by
// the same renderer (sample_cache.h); the accessors are the same.
// What joins a file's name and a record's number in messages: ":" (JSONL lines), ": row "
// (Parquet rows), ": record " (the elements of a JSON array).
const char* record_separator(DataFormat file_format);

class SampleSet {
 public:
  // The records of a `file_format` file (jsonl, json or parquet) read in blocks (a JSONL or JSON
  // file 16 MiB at a time, a Parquet file a row group at a time), each block's records rendered by
  // `options.threads` threads and appended in file order. Parquet: each row as the record its
  // columns spell (parquet.h); JSON: each element of the file's one array (json_array.h). Errors
  // name the record as where() does.
  static SampleSet from_file(const std::string& path, DataFormat file_format, const Tokenizer& tokenizer,
                             const ChatFormat& format, const SampleOptions& options,
                             const SampleProgress& progress = nullptr);
  static SampleSet from_jsonl(const std::string& path, const Tokenizer& tokenizer, const ChatFormat& format,
                              const SampleOptions& options, const SampleProgress& progress = nullptr) {
    return from_file(path, DataFormat::jsonl, tokenizer, format, options, progress);
  }
  static SampleSet from_parquet(const std::string& path, const Tokenizer& tokenizer, const ChatFormat& format,
                                const SampleOptions& options, const SampleProgress& progress = nullptr) {
    return from_file(path, DataFormat::parquet, tokenizer, format, options, progress);
  }

  int64_t size() const { return n_; }
  int64_t length(int64_t i) const { return offsets_[i + 1] - offsets_[i]; }  // ids
  const int32_t* ids(int64_t i) const { return ids_ + offsets_[i]; }
  const uint8_t* trained(int64_t i) const { return trained_ + offsets_[i]; }
  int64_t trained_count(int64_t i) const { return counts_[i]; }  // trained targets of sample i
  int64_t line(int64_t i) const { return lines_[i]; }            // 1-based line (row, record) of the source file
  // "FILE:LINE", "FILE: row N" (Parquet) or "FILE: record N" (a JSON array): where sample i came from.
  std::string where(int64_t i) const { return source_ + separator_ + std::to_string(lines_[i]); }
  int64_t total_ids() const { return offsets_[n_]; }
  int64_t total_trained() const { return total_trained_; }  // trained targets over all samples
  int32_t max_id() const { return max_id_; }
  // A hash of every sample's ids and trained flags, in order (computed as they were rendered).
  uint64_t content_hash() const { return content_hash_; }
  const std::string& source() const { return source_; }
  SampleStats stats;

 private:
  friend class SampleWriter;
  std::string source_;
  std::string separator_ = ":";          // record_separator() of the file's format
  std::shared_ptr<const void> storage_;  // owns the arrays below: vectors, or a file mapping
  const int32_t* ids_ = nullptr;
  const uint8_t* trained_ = nullptr;
  const int64_t* offsets_ = nullptr;  // n_ + 1 entries, offsets_[0] = 0
  const int64_t* lines_ = nullptr;
  const int64_t* counts_ = nullptr;
  int64_t n_ = 0;
  int64_t total_trained_ = 0;
  int32_t max_id_ = -1;
  uint64_t content_hash_ = 0;
};

// One JSONL record as a sample (before truncation). Throws RuntimeError (without location), also
// for a field of the record or of a turn that its kind does not read (a turn's "weight", a
// "system" beside ShareGPT turns, an "id"): refused by name unless `ignore_fields` names it.
Sample render_record(const Tokenizer& tokenizer, const ChatFormat& format, const TrlTokenization& how,
                     const std::string& json_line, bool train_on_prompt, SampleStats& stats,
                     const FieldNames& fields = {}, const std::vector<std::string>& ignore_fields = {});

// One preference record as TRL 1.16 tokenizes it.
// DPOTrainer (DPOTrainer._prepare_dataset):
//   {"prompt", "chosen", "rejected"}  text: the prompt encoded as HF's tokenizer(text) encodes it
//       (the post-processor's special tokens, e.g. BOS), and prompt + completion + eos_token (added
//       when the completion does not end with it) likewise; messages (lists of {"role",
//       "content"}): the prompt with the template's generation prompt, and prompt + completion as
//       the template renders the whole chat. The completion — every token after the longest
//       prefix the prompt shares with both — is trained, the rest is not.
// CPOTrainer (`how.cpo`; maybe_apply_chat_template, then tokenize_row): chats first become text —
//   the prompt is the characters the prompt's rendering (with the generation prompt) shares with
//   both whole chats', each completion the rest of its chat's. Then, with no special tokens added:
//   the completion starts where enc(prompt) ends in enc(prompt + completion), one token earlier
//   where their tokens part; the bos_token is put before a prompt that does not start with it, the
//   eos_token after a completion that does not end with it (both by id).
// {"chosen", "rejected"} without "prompt": the prompt is their longest common prefix (of
// characters, or of turns), as TRL's extract_prompt cuts it.
// `how.eos` is the tokenizer's eos_token ("" refuses DPO's text records and every CPO record).
struct PreferencePair {
  Sample chosen, rejected;
  int64_t prompt_ids = 0;        // the tokens before the completions (CPO: the longer of the two)
  bool prompt_diverged = false;  // the prompt alone does not tokenize to that prefix
  bool conversational = false;
};
PreferencePair render_preference(const Tokenizer& tokenizer, const ChatFormat& format, const TrlTokenization& how,
                                 const std::string& json_line, const FieldNames& fields = {},
                                 const std::vector<std::string>& ignore_fields = {});

// KTO's records as TRL 1.16's KTOTrainer tokenizes them (_prepare_dataset): unpaired {"prompt",
// "completion", "label"} (label true / 1: desirable, false / 0: not), or a preference record
// {"prompt", "chosen", "rejected"} (its prompt extracted as for DPO when absent) unpaired into its
// chosen (desirable) and rejected completions. Each completion is tokenized on its own as
// DPOTrainer tokenizes one (text: prompt + completion + eos_token; messages: the prompt with the
// generation prompt, and the whole chat), and starts where its tokens part from the prompt's. A
// sample's trained flags mark the completion and carry its label: kDesirable or kUndesirable.
// Samples are whole: KTO's rows are cut when they are made (data/rows.h KtoRows).
constexpr uint8_t kDesirable = 1, kUndesirable = 2;
struct KtoExample {
  Sample sample;
  bool desirable = true;
  bool prompt_diverged = false;
};
struct KtoRecord {
  std::vector<KtoExample> examples;  // one, or a paired record's chosen then rejected
  bool conversational = false;
  bool paired = false;
};
KtoRecord render_kto(const Tokenizer& tokenizer, const ChatFormat& format, const TrlTokenization& how,
                     const std::string& json_line, const FieldNames& fields = {},
                     const std::vector<std::string>& ignore_fields = {});

}  // namespace ptrain
