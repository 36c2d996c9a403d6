// JSONL samples (text / chat / prompt-completion records, the loss mask, truncation, bad
// records) and the rows made of them (padding, packing, the split, the seeded order). Also
// built under AddressSanitizer: the JSONL reader takes untrusted input.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <tuple>

#include "common/error.h"
#include "common/fs_util.h"
#include "common/python_json.h"
#include "data/parquet.h"
#include "data/rows.h"
#include "data/sample_cache.h"
#include "data/samples.h"
#include "model/loss.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

using namespace ptrain;

namespace {

const Tokenizer& tok() {
  static const Tokenizer t(test::fixture("tokenizer_bpe"));
  return t;
}
int32_t id(const std::string& token) { return tok().id_of(token).value(); }

std::vector<int32_t> cat(std::initializer_list<std::vector<int32_t>> parts) {
  std::vector<int32_t> out;
  for (const auto& p : parts) out.insert(out.end(), p.begin(), p.end());
  return out;
}

const ChatFormat& format() {
  static const ChatFormat f = chat_format(tok(), ChatTemplate::automatic);  // Llama 3's: the tokenizer's header tokens
  return f;
}

// tokenizer_bpe is a bare tokenizer.json, naming no eos_token: text records end with this one.
SampleOptions options() {
  SampleOptions o;
  o.trl.eos = "<|end_of_text|>";
  return o;
}

SampleSet load(const std::string& path, SampleOptions o = options()) {
  return SampleSet::from_jsonl(path, tok(), format(), o);
}

std::vector<int32_t> ids_of(const SampleSet& s, int64_t i) { return {s.ids(i), s.ids(i) + s.length(i)}; }
std::vector<uint8_t> trained_of(const SampleSet& s, int64_t i) { return {s.trained(i), s.trained(i) + s.length(i)}; }

// A JSONL file of n chats whose lengths vary (1 to 3 turns, words of varying count).
std::string chats_file(const test::TempDir& dir, int n) {
  std::string out;
  for (int i = 0; i < n; ++i) {
    out += R"({"messages": [{"role": "user", "content": "question )" + std::to_string(i) + R"("})";
    for (int t = 0; t < 1 + i % 3; ++t)
      out += R"(, {"role": "assistant", "content": ")" + std::string(static_cast<size_t>(1 + (i * 7) % 11), 'a') +
             R"( answer"}, {"role": "user", "content": "more"})";
    out += R"(, {"role": "assistant", "content": "done"}]})"
           "\n";
  }
  test::write_text(dir / "chats.jsonl", out);
  return dir / "chats.jsonl";
}

}  // namespace

TEST(Samples, EachRecordKindRendersWithItsLossMask) {
  test::TempDir dir;
  test::write_text(dir / "d.jsonl",
                   "{\"text\": \"the model trains\"}\n"
                   "\n"  // blank lines are skipped
                   "{\"prompt\": \"What is 2+2?\", \"completion\": \" 4\"}\n"
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"hi\"}, {\"role\": \"assistant\", \"content\": "
                   "\"hello\"}]}\n");
  const int32_t eos = id("<|end_of_text|>");
  for (bool on_prompt : {false, true}) {
    SampleOptions o = options();
    o.train_on_prompt = on_prompt;
    const SampleSet s = load(dir / "d.jsonl", o);
    ASSERT_EQ(s.size(), 3);
    EXPECT_EQ(s.stats.records, 3);
    EXPECT_EQ(s.stats.text, 1);
    EXPECT_EQ(s.stats.prompt_completion, 1);
    EXPECT_EQ(s.stats.chat, 1);
    EXPECT_EQ(s.line(0), 1);
    EXPECT_EQ(s.line(1), 3);
    EXPECT_EQ(s.line(2), 4);
    // text: tokenizer(text + eos_token) — tokenizer_bpe's post-processor adds no BOS —, all trained.
    EXPECT_EQ(ids_of(s, 0), cat({tok().encode("the model trains"), {eos}}));
    EXPECT_EQ(trained_of(s, 0), std::vector<uint8_t>(s.length(0), 1));
    // prompt/completion: encoded whole, the completion (after the prompt's ids) and the
    // eos_token trained unless train_on_prompt.
    const auto prompt = tok().encode("What is 2+2?"), whole = tok().encode("What is 2+2? 4");
    EXPECT_EQ(ids_of(s, 1), cat({whole, {eos}}));
    std::vector<uint8_t> mask(prompt.size(), on_prompt ? 1 : 0);
    mask.insert(mask.end(), whole.size() + 1 - prompt.size(), 1);
    EXPECT_EQ(trained_of(s, 1), mask);
    // chat: exactly render_chat's (equal to transformers' apply_chat_template, Chat.* tests).
    const Sample chat = render_chat(tok(), format(), {{"user", "hi"}, {"assistant", "hello"}}, on_prompt);
    EXPECT_EQ(ids_of(s, 2), chat.ids);
    EXPECT_EQ(trained_of(s, 2), chat.trained);
    int64_t trained = 0;
    for (int64_t i = 0; i < s.size(); ++i)
      for (int64_t t = 1; t < s.length(i); ++t) trained += s.trained(i)[t];
    EXPECT_EQ(s.total_trained(), trained);
  }
}

TEST(Samples, BadRecordsNameTheFileAndLine) {
  test::TempDir dir;
  const std::string good = "{\"text\": \"ok\"}\n";
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"text\": \"unterminated}\n", "not valid JSON"},
      {"[1, 2]\n", "must be a JSON object"},
      {"{\"txt\": \"typo\"}\n", "(it has: txt)"},
      {"{\"text\": 42}\n", "\"text\" must be a string"},
      {"{\"prompt\": \"only a prompt\"}\n", "needs both \"prompt\" and \"completion\""},
      {"{\"messages\": []}\n", "non-empty array"},
      {"{\"messages\": [{\"role\": \"user\"}]}\n", "needs \"role\" and \"content\""},
      {"{\"messages\": [{\"role\": \"robot\", \"content\": \"beep\"}]}\n", "unknown role 'robot'"},
      {"{\"conversations\": [{\"from\": \"human\"}]}\n", "needs \"from\" and \"value\""},
      {"{\"conversations\": [{\"from\": \"bot\", \"value\": \"x\"}]}\n", "unknown role 'bot'"},
      {"{\"instruction\": \"do it\"}\n", "needs \"instruction\" and \"output\""},
  };
  for (const auto& [line, why] : cases) {
    test::write_text(dir / "bad.jsonl", good + "\n" + line + good);
    try {
      load(dir / "bad.jsonl");
      ADD_FAILURE() << "accepted: " << line;
    } catch (const RuntimeError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find(dir / "bad.jsonl:3: "), std::string::npos) << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << msg;
    }
  }
  EXPECT_THROW(load(dir / "missing.jsonl"), RuntimeError);
}

// Alpaca and ShareGPT records are the conversations they hold: the same samples (ids and loss
// mask) as ptrain's {"messages"} records of the same turns.
TEST(Samples, AlpacaAndShareGptAreTheirConversations) {
  test::TempDir dir;
  test::write_text(dir / "alpaca.jsonl",
                   "{\"instruction\": \"Add the numbers.\", \"input\": \"2 and 3\", \"output\": \"5\"}\n"
                   "{\"instruction\": \"Say hi.\", \"input\": \"\", \"output\": \"hi\", \"system\": \"Be brief.\"}\n"
                   "{\"instruction\": \"And 4 + 4?\", \"output\": \"8\", \"system\": \"Be brief.\", "
                   "\"history\": [[\"What is 2 + 3?\", \"5\"], [\"And 1 + 1?\", \"2\"]]}\n");
  test::write_text(dir / "sharegpt.jsonl",
                   "{\"conversations\": [{\"from\": \"human\", \"value\": \"Add the numbers.\\n\\n2 and 3\"}, "
                   "{\"from\": \"gpt\", \"value\": \"5\"}]}\n"
                   "{\"conversations\": [{\"from\": \"system\", \"value\": \"Be brief.\"}, {\"from\": \"human\", "
                   "\"value\": \"Say hi.\"}, {\"from\": \"gpt\", \"value\": \"hi\"}]}\n"
                   "{\"conversations\": [{\"from\": \"system\", \"value\": \"Be brief.\"}, {\"from\": \"human\", "
                   "\"value\": \"What is 2 + 3?\"}, {\"from\": \"gpt\", \"value\": \"5\"}, {\"from\": \"human\", "
                   "\"value\": \"And 1 + 1?\"}, {\"from\": \"gpt\", \"value\": \"2\"}, {\"from\": \"human\", "
                   "\"value\": \"And 4 + 4?\"}, {\"from\": \"gpt\", \"value\": \"8\"}]}\n");
  test::write_text(
      dir / "messages.jsonl",
      "{\"messages\": [{\"role\": \"user\", \"content\": \"Add the numbers.\\n\\n2 and 3\"}, "
      "{\"role\": \"assistant\", \"content\": \"5\"}]}\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
      "\"content\": \"Say hi.\"}, {\"role\": \"assistant\", \"content\": \"hi\"}]}\n"
      "{\"messages\": [{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", "
      "\"content\": \"What is 2 + 3?\"}, {\"role\": \"assistant\", \"content\": \"5\"}, {\"role\": "
      "\"user\", \"content\": \"And 1 + 1?\"}, {\"role\": \"assistant\", \"content\": \"2\"}, "
      "{\"role\": \"user\", \"content\": \"And 4 + 4?\"}, {\"role\": \"assistant\", \"content\": \"8\"}]}\n");
  const SampleSet want = load(dir / "messages.jsonl");
  ASSERT_EQ(want.size(), 3);
  for (const std::string name : {"alpaca.jsonl", "sharegpt.jsonl"}) {
    const SampleSet got = load(dir / name);
    ASSERT_EQ(got.size(), want.size()) << name;
    EXPECT_EQ(got.stats.chat, 3) << name;
    for (int64_t i = 0; i < want.size(); ++i) {
      EXPECT_EQ(ids_of(got, i), ids_of(want, i)) << name << " record " << i;
      EXPECT_EQ(trained_of(got, i), trained_of(want, i)) << name << " record " << i;
    }
  }
}

// Parquet rows (written by pyarrow: tests/fixtures/make_parquet_fixtures.py) are the records their
// columns spell: messages as list<struct<role, content>>, ShareGPT conversations, dictionary-
// encoded Alpaca columns, large_string text beside an unused int64 column — the same samples as
// the same records in JSONL. A column with no JSON equivalent is refused naming it.
TEST(Samples, ParquetRowsAreTheRecordsTheirColumnsSpell) {
  if (!parquet_supported()) GTEST_SKIP() << "built without Parquet support (no pyarrow in the venv)";
  const SampleSet want = load(test::fixture("parquet/records.jsonl"));
  ASSERT_EQ(want.size(), 8);
  int64_t at = 0;
  SampleOptions no_id = options();  // text.parquet has an "id" column beside "text": left out knowingly
  no_id.ignore_fields = {"id"};
  for (const auto& [name, rows] : std::vector<std::pair<std::string, int64_t>>{
           {"messages.parquet", 3}, {"alpaca.parquet", 3}, {"text.parquet", 2}}) {
    const SampleSet got = SampleSet::from_parquet(test::fixture("parquet/" + name), tok(), format(), no_id);
    ASSERT_EQ(got.size(), rows) << name;
    for (int64_t i = 0; i < rows; ++i) {
      EXPECT_EQ(ids_of(got, i), ids_of(want, at + i)) << name << " row " << i + 1;
      EXPECT_EQ(trained_of(got, i), trained_of(want, at + i)) << name << " row " << i + 1;
      EXPECT_EQ(got.line(i), i + 1);
    }
    if (name == "messages.parquet") {  // ShareGPT holds the same chats
      const SampleSet sharegpt =
          SampleSet::from_parquet(test::fixture("parquet/sharegpt.parquet"), tok(), format(), options());
      ASSERT_EQ(sharegpt.size(), rows);
      for (int64_t i = 0; i < rows; ++i) {  // (three row groups: rows keep their numbers across them)
        EXPECT_EQ(ids_of(sharegpt, i), ids_of(want, i)) << "sharegpt row " << i + 1;
        EXPECT_EQ(sharegpt.line(i), i + 1);
      }
    }
    at += rows;
  }
  try {
    SampleSet::from_parquet(test::fixture("parquet/binary.parquet"), tok(), format(), options());
    ADD_FAILURE() << "a binary column was accepted";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("row 1: column 'blob' holds binary values"), std::string::npos) << e.what();
  }
  try {  // a column no record kind reads, not left out
    SampleSet::from_parquet(test::fixture("parquet/text.parquet"), tok(), format(), options());
    ADD_FAILURE() << "the id column was passed over";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("text.parquet: row 1: a \"text\" record holds \"id\", which ptrain does not "
                                         "read (it reads \"text\")"),
              std::string::npos)
        << e.what();
  }
  EXPECT_THROW(SampleSet::from_parquet(test::fixture("parquet/records.jsonl"), tok(), format(), options()),
               RuntimeError);
  // A footer claiming more rows than the file holds (found by fuzz_parquet: Arrow sized its arrays
  // for 70 billion rows and ran out of memory) is refused before any row group is read.
  try {
    parquet_records(test::source_dir() + "/fuzz/regressions/parquet/row_group_claims_70e9_rows",
                    [](std::vector<std::string>&&, int64_t, int64_t) {});
    ADD_FAILURE() << "a row group claiming 70 billion rows was read";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("row group 1 claims 70432781950 rows; ptrain reads row groups of up to"),
              std::string::npos)
        << e.what();
  }
  // A dictionary index beyond the dictionary (found by fuzz_parquet: Arrow decoded it and a
  // string was read from outside its buffer): every buffer is validated before a value is read.
  try {
    parquet_records(test::source_dir() + "/fuzz/regressions/parquet/dictionary_index_out_of_range",
                    [](std::vector<std::string>&&, int64_t, int64_t) {});
    ADD_FAILURE() << "a dictionary index out of range was read";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(
                  "row group 1 is damaged: Invalid: Column 0: In chunk 0: Invalid: Dictionary indices invalid"),
              std::string::npos)
        << e.what();
  }
}

// data.fields maps a dataset's own names onto the record fields (in the record and in each turn);
// data.on_bad_record = "skip" leaves malformed records out, counted, the first one named.
TEST(Samples, OwnFieldNamesAndSkippedBadRecords) {
  test::TempDir dir;
  test::write_text(dir / "alpaca.jsonl", "{\"instruction\": \"Say hi.\", \"output\": \"hi\"}\n");
  test::write_text(dir / "renamed.jsonl", "{\"question\": \"Say hi.\", \"answer\": \"hi\"}\n");
  test::write_text(dir / "messages.jsonl",
                   "{\"messages\": [{\"role\": \"user\", \"content\": \"Say hi.\"}, {\"role\": \"assistant\", "
                   "\"content\": \"hi\"}]}\n");
  test::write_text(dir / "dialog.jsonl",
                   "{\"dialog\": [{\"speaker\": \"user\", \"text\": \"Say hi.\"}, {\"speaker\": \"assistant\", "
                   "\"text\": \"hi\"}]}\n");
  SampleOptions renamed = options();
  renamed.fields = {{"instruction", "question"}, {"output", "answer"}};
  EXPECT_EQ(ids_of(SampleSet::from_jsonl(dir / "renamed.jsonl", tok(), format(), renamed), 0),
            ids_of(load(dir / "alpaca.jsonl"), 0));
  SampleOptions dialog = options();
  dialog.fields = {{"messages", "dialog"}, {"role", "speaker"}, {"content", "text"}};
  const SampleSet d = SampleSet::from_jsonl(dir / "dialog.jsonl", tok(), format(), dialog);
  EXPECT_EQ(ids_of(d, 0), ids_of(load(dir / "messages.jsonl"), 0));
  EXPECT_EQ(trained_of(d, 0), trained_of(load(dir / "messages.jsonl"), 0));

  test::write_text(dir / "bad.jsonl", "{\"text\": \"ok\"}\n{\"text\": 42}\n{\"text\": \"fine\"}\n{broken\n");
  EXPECT_THROW(load(dir / "bad.jsonl"), RuntimeError);
  SampleOptions skip = options();
  skip.skip_bad_records = true;
  const SampleSet kept = SampleSet::from_jsonl(dir / "bad.jsonl", tok(), format(), skip);
  EXPECT_EQ(kept.size(), 2);
  EXPECT_EQ(kept.stats.skipped_bad, 2);
  EXPECT_EQ(kept.stats.text, 2);
  EXPECT_NE(kept.stats.first_bad.find("bad.jsonl:2: \"text\" must be a string"), std::string::npos)
      << kept.stats.first_bad;
}

// A field a record kind does not read — of the record or of a turn — is refused naming it, the
// record's line and the fix, never left out of the sample silently: a turn's weight, a reply's
// reasoning_content under a template that does not render it (Qwen3's does), a system prompt
// beside ShareGPT turns, a second record kind, metadata.
// data.ignore_fields leaves fields out knowingly (the sample is then the record without them).
TEST(Samples, FieldsNoRecordKindReadsAreRefusedOrLeftOutKnowingly) {
  test::TempDir dir;
  const std::string user = R"({"role": "user", "content": "Say hi."})";
  const std::string reply = R"({"role": "assistant", "content": "hi"})";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"messages": [)" + user + R"(, {"role": "assistant", "content": "hi", "weight": 0}]})",
       "message 2 holds \"weight\", which ptrain does not read (it reads \"role\", \"content\", "
       "\"reasoning_content\", \"tool_calls\")"},
      {R"({"messages": [)" + user + R"(, {"role": "assistant", "content": "hi", "reasoning_content": "r"}]})",
       "message 2 holds reasoning_content, which only Qwen3's template renders, and only in a reply (these "
       "chats render as llama3)"},
      {R"({"messages": [)" + user + "," + reply + R"(], "text": "rendered"})", "a \"messages\" record holds \"text\""},
      {R"({"system": "Be brief.", "conversations": [{"from": "human", "value": "Say hi."}, {"from": "gpt", "value": "hi"}]})",
       "a \"conversations\" record holds \"system\", which ptrain does not read (it reads \"conversations\") (put it "
       "in the chat as its first turn"},
      {R"({"conversations": [{"from": "human", "value": "Say hi.", "lang": "en"}, {"from": "gpt", "value": "hi"}]})",
       "turn 1 holds \"lang\""},
      {R"({"instruction": "Say hi.", "output": "hi", "tools": []})", "an Alpaca record holds \"tools\""},
      {R"({"prompt": "Say", "completion": " hi", "chosen": "x"})", "a prompt/completion record holds \"chosen\""},
      {R"({"text": "hello", "id": 7})", "a \"text\" record holds \"id\""},
  };
  for (size_t i = 0; i < cases.size(); ++i) {
    const std::string path = dir / "c" + std::to_string(i) + ".jsonl";
    test::write_text(path, "{\"text\": \"first\"}\n" + cases[i].first + "\n");
    try {
      load(path);
      ADD_FAILURE() << "read: " << cases[i].first;
    } catch (const RuntimeError& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find(path + ":2: " + cases[i].second), std::string::npos) << what;
      EXPECT_NE(what.find("list it in data.ignore_fields"), std::string::npos) << what;
    }
  }
  // Alpaca's "history" is read (as LLaMA-Factory writes it: AlpacaAndShareGptAreTheirConversations),
  // so it must be [instruction, output] pairs.
  test::write_text(dir / "history.jsonl", R"({"instruction": "Say hi.", "output": "hi", "history": [["a"]]})"
                                          "\n");
  try {
    load(dir / "history.jsonl");
    ADD_FAILURE() << "a history turn of one string was read";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("history.jsonl:1: each turn of \"history\" must be [instruction, output]"),
              std::string::npos)
        << e.what();
  }
  // Left out knowingly: the same samples as the records without them.
  test::write_text(dir / "meta.jsonl", R"({"id": 1, "messages": [)" + user +
                                           R"(, {"role": "assistant", "content": "hi", "weight": 1}], "source": "s"})"
                                           "\n");
  test::write_text(dir / "plain.jsonl", R"({"messages": [)" + user + "," + reply + "]}\n");
  SampleOptions ignore = options();
  ignore.ignore_fields = {"id", "weight", "source"};
  const SampleSet meta = SampleSet::from_jsonl(dir / "meta.jsonl", tok(), format(), ignore);
  EXPECT_EQ(ids_of(meta, 0), ids_of(load(dir / "plain.jsonl"), 0));
  EXPECT_EQ(trained_of(meta, 0), trained_of(load(dir / "plain.jsonl"), 0));
}

TEST(Samples, LongSamplesAreTruncatedOrDroppedAndCounted) {
  test::TempDir dir;
  // A long text, a chat whose reply starts after the cut, and a short text.
  const std::string long_text(400, 'x');
  test::write_text(dir / "d.jsonl", "{\"text\": \"" + long_text +
                                        "\"}\n"
                                        "{\"messages\": [{\"role\": \"user\", \"content\": \"" +
                                        std::string(200, 'q') + " " + std::string(200, 'w') +
                                        "\"}, {\"role\": \"assistant\", \"content\": \"late\"}]}\n"
                                        "{\"text\": \"short\"}\n");
  const auto full = tok().encode(long_text);
  SampleOptions o = options();
  o.max_ids = 17;
  ASSERT_GT(static_cast<int64_t>(full.size()) + 2, o.max_ids);
  const SampleSet cut = load(dir / "d.jsonl", o);
  EXPECT_EQ(cut.stats.truncated, 2);          // the long text, and the chat...
  EXPECT_EQ(cut.stats.dropped_untrained, 1);  // ...whose reply was cut off: nothing left to train
  ASSERT_EQ(cut.size(), 2);
  EXPECT_EQ(cut.length(0), 17);
  EXPECT_EQ(ids_of(cut, 0), std::vector<int32_t>(full.begin(), full.begin() + 17));  // its first 17 ids
  EXPECT_EQ(cut.line(1), 3);

  o.drop_too_long = true;
  const SampleSet dropped = load(dir / "d.jsonl", o);
  EXPECT_EQ(dropped.stats.dropped_too_long, 2);
  EXPECT_EQ(dropped.stats.truncated, 0);
  ASSERT_EQ(dropped.size(), 1);
  EXPECT_EQ(dropped.line(0), 3);
}

TEST(Rows, PaddedRowsHoldOneSampleAndItsTargets) {
  test::TempDir dir;
  auto set = std::make_shared<SampleSet>(load(chats_file(dir, 9)));
  int64_t longest = 0;
  for (int64_t i = 0; i < set->size(); ++i) longest = std::max(longest, set->length(i));
  const int64_t T = longest - 1 + 3;  // odd: room left over in every row
  SampleSplit split{{0, 1, 2, 3, 4, 5, 6}, {7, 8}};
  SampleRows rows(set, split, T, 11, /*packing=*/false);
  EXPECT_EQ(rows.train_fill().rows, 7);
  EXPECT_EQ(rows.val_rows(), 2);
  const Batch b = rows.val_batch(0, 2);
  EXPECT_FALSE(b.doc_ids.defined());
  for (int64_t r = 0; r < 2; ++r) {
    const int64_t s = split.val[r], n = set->length(s);
    Sample sample{ids_of(*set, s), trained_of(*set, s)};
    const std::vector<int64_t> targets = sample.targets();
    for (int64_t t = 0; t < T; ++t) {
      EXPECT_EQ(b.inputs[r][t].item<int64_t>(), t < n - 1 ? sample.ids[t] : 0) << r << "," << t;
      EXPECT_EQ(b.targets[r][t].item<int64_t>(), t < n - 1 ? targets[t] : kIgnoreIndex) << r << "," << t;
    }
  }
  // One epoch of training rows is the training samples, each once.
  std::multiset<int64_t> firsts, expected;
  const Batch epoch = rows.train_rows(0, 7);
  for (int64_t r = 0; r < 7; ++r) firsts.insert(epoch.targets[r].ne(kIgnoreIndex).sum().item<int64_t>());
  for (int64_t s : split.train) {
    int64_t n = 0;
    for (int64_t t = 1; t < set->length(s); ++t) n += set->trained(s)[t];
    expected.insert(n);
  }
  EXPECT_EQ(firsts, expected);
}

TEST(Rows, PackingIsFirstFitSeededAndResumesAtAnyRow) {
  test::TempDir dir;
  auto set = std::make_shared<SampleSet>(load(chats_file(dir, 40)));
  const SampleSplit split = split_samples(set->size(), 0.1);
  int64_t longest = 0;
  for (int64_t i = 0; i < set->size(); ++i) longest = std::max(longest, set->length(i));
  const int64_t T = longest + 24;  // the longest sample and a bit: rows hold one to a few samples
  SampleRows rows(set, split, T, 3, /*packing=*/true);
  int64_t positions = 0, trained = 0;
  for (int64_t s : split.train) {
    positions += set->length(s) - 1;
    for (int64_t t = 1; t < set->length(s); ++t) trained += set->trained(s)[t];
  }
  // Every epoch holds every training position once, packed into fewer rows than samples.
  const RowFill f = rows.train_fill();
  EXPECT_EQ(f.positions, positions);
  EXPECT_EQ(f.trained, trained);
  EXPECT_LT(f.rows, static_cast<int64_t>(split.train.size()));  // packing did pack
  const Batch epoch0 = rows.train_rows(0, f.rows);
  EXPECT_EQ(epoch0.targets.ne(kIgnoreIndex).sum().item<int64_t>(), trained);
  for (int64_t r = 0; r < f.rows; ++r) {
    // Documents are numbered 0, 1, ... along the row, and no document is cut off: a target
    // is never the next document's token.
    const at::Tensor d = epoch0.doc_ids[r];
    EXPECT_TRUE(d.diff().ge(0).all().item<bool>());
    EXPECT_TRUE(d.diff().le(1).all().item<bool>());
    EXPECT_EQ(d[0].item<int64_t>(), 0);
  }
  // Row k is a function of (data, seed, k): a fresh source asked for rows in another order,
  // across the epoch boundary, gives the same rows; another seed gives another order.
  SampleRows again(set, split, T, 3, true);
  const uint64_t k = static_cast<uint64_t>(f.rows) + 2;  // epoch 1
  const Batch late = again.train_rows(k - 3, 5);         // rows spanning epochs 0 and 1
  const Batch direct = rows.train_rows(k - 3, 5);
  EXPECT_TRUE(at::equal(late.inputs, direct.inputs));
  EXPECT_TRUE(at::equal(late.targets, direct.targets));
  EXPECT_TRUE(at::equal(late.doc_ids, direct.doc_ids));
  EXPECT_TRUE(at::equal(again.train_rows(0, 2).inputs, epoch0.inputs.narrow(0, 0, 2)));
  SampleRows other(set, split, T, 4, true);
  EXPECT_FALSE(at::equal(other.train_rows(0, 2).inputs, epoch0.inputs.narrow(0, 0, 2)));
  // Validation rows pack the validation samples in file order.
  EXPECT_EQ(rows.val_fill().positions, [&] {
    int64_t p = 0;
    for (int64_t s : split.val) p += set->length(s) - 1;
    return p;
  }());
}

TEST(Rows, TheSplitIsBySampleFixedAndDisjoint) {
  for (int64_t n : {1, 2, 7, 100, 1001}) {
    for (double fraction : {0.0, 0.05, 0.5}) {
      const SampleSplit s = split_samples(n, fraction);
      std::set<int64_t> all(s.train.begin(), s.train.end());
      all.insert(s.val.begin(), s.val.end());
      EXPECT_EQ(static_cast<int64_t>(all.size()), n);
      EXPECT_EQ(static_cast<int64_t>(s.train.size() + s.val.size()), n);
      EXPECT_TRUE(std::is_sorted(s.val.begin(), s.val.end()));
      EXPECT_GE(s.train.size(), 1u);
      const int64_t want =
          fraction == 0 || n < 2 ? 0 : std::max<int64_t>(1, std::llround(static_cast<double>(n) * fraction));
      EXPECT_EQ(static_cast<int64_t>(s.val.size()), std::min(want, n - 1)) << n << " " << fraction;
      EXPECT_EQ(split_samples(n, fraction).val, s.val);  // the same draw every time
    }
  }
}

namespace {
// Every sample, count and total of two sets equal.
void expect_same_set(const SampleSet& got, const SampleSet& want, const std::string& what) {
  SCOPED_TRACE(what);
  ASSERT_EQ(got.size(), want.size());
  for (int64_t i = 0; i < want.size(); ++i) {
    ASSERT_EQ(ids_of(got, i), ids_of(want, i)) << "sample " << i;
    ASSERT_EQ(trained_of(got, i), trained_of(want, i)) << "sample " << i;
    ASSERT_EQ(got.line(i), want.line(i)) << "sample " << i;
    ASSERT_EQ(got.trained_count(i), want.trained_count(i)) << "sample " << i;
  }
  EXPECT_EQ(got.total_ids(), want.total_ids());
  EXPECT_EQ(got.total_trained(), want.total_trained());
  EXPECT_EQ(got.max_id(), want.max_id());
  EXPECT_EQ(got.content_hash(), want.content_hash());
  const SampleStats &g = got.stats, &w = want.stats;
  EXPECT_EQ(std::make_tuple(g.records, g.text, g.chat, g.prompt_completion, g.truncated, g.dropped_too_long,
                            g.skipped_bad, g.first_bad, g.dropped_untrained),
            std::make_tuple(w.records, w.text, w.chat, w.prompt_completion, w.truncated, w.dropped_too_long,
                            w.skipped_bad, w.first_bad, w.dropped_untrained));
}

// 301 chats of varying length with a malformed line, a chat with nothing to train and a text
// record among them, and blank lines.
std::string mixed_file(const test::TempDir& dir) {
  std::string text = read_text_file(chats_file(dir, 301));
  text.insert(text.find('\n', text.size() / 3) + 1,
              "{\"messages\": [{\"role\": \"user\", \"content\": \"no reply\"}]}\n\n{not json\n");
  text.insert(text.find('\n', text.size() / 2) + 1, "{\"text\": \"plain text among chats\"}\n\n\n");
  test::write_text(dir / "mixed.jsonl", text);
  return dir / "mixed.jsonl";
}
}  // namespace

// The file is read in blocks (here 997 bytes: lines straddle blocks, a line longer than a block
// is read whole), each block's records rendered by several threads: the samples, their lines
// and every count equal one thread reading the whole file at once. The cache file holds the
// same, built by one thread or three, and a later open maps it back.
TEST(SampleCache, HoldsWhatTokenizingInMemoryGivesForAnyBlockAndThreadCount) {
  test::TempDir dir;
  const std::string data = mixed_file(dir);
  SampleOptions o = options();
  o.max_ids = 41;  // some chats are cut
  o.skip_bad_records = true;
  o.block_bytes = int64_t{1} << 30;
  const SampleSet want = SampleSet::from_jsonl(data, tok(), format(), o);
  ASSERT_GT(want.stats.truncated, 0);
  ASSERT_EQ(want.stats.skipped_bad, 1);
  ASSERT_EQ(want.stats.dropped_untrained, 1);
  ASSERT_EQ(want.stats.text, 1);
  for (int threads : {1, 3}) {
    o.threads = threads;
    o.block_bytes = 997;
    expect_same_set(SampleSet::from_jsonl(data, tok(), format(), o), want,
                    "in memory, " + std::to_string(threads) + " threads, blocks of 997 bytes");
    const SampleCacheKey key =
        sample_cache_key(dir / ("cache" + std::to_string(threads)), data, DataFormat::jsonl, tok(), format(), o);
    std::string why;
    EXPECT_FALSE(open_sample_cache(key, data, &why));
    EXPECT_EQ(why, "");  // absent, not damaged
    expect_same_set(build_sample_cache(key, data, DataFormat::jsonl, tok(), format(), o, nullptr), want,
                    "built, " + std::to_string(threads) + " threads");
    const std::optional<SampleSet> mapped = open_sample_cache(key, data, &why);
    ASSERT_TRUE(mapped) << why;
    expect_same_set(*mapped, want, "mapped");
  }
  if (parquet_supported()) {  // a Parquet file through the cache, a row group at a time
    const std::string pq = test::fixture("parquet/sharegpt.parquet");
    const SampleCacheKey key = sample_cache_key(dir / "pq", pq, DataFormat::parquet, tok(), format(), options());
    build_sample_cache(key, pq, DataFormat::parquet, tok(), format(), options(), nullptr);
    expect_same_set(open_sample_cache(key, pq, nullptr).value(),
                    SampleSet::from_parquet(pq, tok(), format(), options()), "parquet");
  }
}

// The key changes with everything the samples depend on — the data file's bytes or time, the
// tokenizer.json, the chat template, the data options — and with nothing else.
TEST(SampleCache, AnyInputTheSamplesDependOnIsAnotherKey) {
  test::TempDir dir;
  const std::string data = chats_file(dir, 5);
  const auto key = [&](const Tokenizer& t, const ChatFormat& f, const SampleOptions& o) {
    return sample_cache_key(dir / "cache", data, DataFormat::jsonl, t, f, o).hash;
  };
  SampleOptions o = options();
  o.max_ids = 64;
  const uint64_t base = key(tok(), format(), o);
  SampleOptions threads = o;
  threads.threads = 7;
  threads.block_bytes = 100;
  EXPECT_EQ(key(tok(), format(), threads), base);  // how it is read is not what it holds
  std::map<std::string, uint64_t> others;
  for (const auto& [name, change] : std::vector<std::pair<std::string, std::function<void(SampleOptions&)>>>{
           {"max_ids", [](SampleOptions& x) { x.max_ids = 65; }},
           {"drop_too_long", [](SampleOptions& x) { x.drop_too_long = true; }},
           {"train_on_prompt", [](SampleOptions& x) { x.train_on_prompt = true; }},
           {"skip_bad_records", [](SampleOptions& x) { x.skip_bad_records = true; }},
           {"preference", [](SampleOptions& x) { x.preference = true; }},
           {"eos", [](SampleOptions& x) { x.trl.eos = "<|eot_id|>"; }},
           {"bos", [](SampleOptions& x) { x.trl.bos = "<|begin_of_text|>"; }},
           {"cpo", [](SampleOptions& x) { x.trl.cpo = true; }},
           {"fields", [](SampleOptions& x) {
              x.fields = {{"output", "answer"}};
            }}}) {
    SampleOptions changed = o;
    change(changed);
    others[name] = key(tok(), format(), changed);
  }
  others["chatml"] = key(tok(), chat_format(tok(), ChatTemplate::chatml), o);
  ChatFormat with_tools = format();  // the same template, its tool branches rendered (Qwen2.5's) or not
  with_tools.tools = true;
  others["tools"] = key(tok(), with_tools, o);
  // The same tokenizer with one more byte in its tokenizer.json.
  std::filesystem::create_directory(dir / "tok");
  test::write_text(dir / "tok/tokenizer.json", read_text_file(tok().path()) + "\n");
  const Tokenizer edited(dir / "tok/tokenizer.json");
  others["tokenizer.json"] = key(edited, format(), o);
  // The data: one more record; then the same bytes written again (a new modification time).
  const std::string before = read_text_file(data);
  test::write_text(data, before + "{\"text\": \"one more\"}\n");
  others["data bytes"] = key(tok(), format(), o);
  test::write_text(data, before);
  std::filesystem::last_write_time(data, std::filesystem::last_write_time(data) + std::chrono::seconds(5));
  others["data time"] = key(tok(), format(), o);
  std::set<uint64_t> distinct{base};
  for (const auto& [name, h] : others) {
    EXPECT_NE(h, base) << name;
    distinct.insert(h);
  }
  EXPECT_EQ(distinct.size(), others.size() + 1);
}

// A cache file that does not verify is never used: a flipped byte anywhere (here in the ids),
// lost bytes, a truncated file, another file under its name. open_sample_cache says why.
TEST(SampleCache, ADamagedCacheFileIsRefusedSayingWhy) {
  test::TempDir dir;
  const std::string data = chats_file(dir, 40);
  const SampleCacheKey key = sample_cache_key(dir / "cache", data, DataFormat::jsonl, tok(), format(), options());
  build_sample_cache(key, data, DataFormat::jsonl, tok(), format(), options(), nullptr);
  const std::string good = read_text_file(key.path);
  const auto why_not = [&](const std::string& bytes) {
    test::write_text(key.path, bytes);
    std::string why;
    EXPECT_FALSE(open_sample_cache(key, data, &why));
    return why;
  };
  std::string flipped = good;
  flipped[17] ^= 0x04;
  EXPECT_NE(why_not(flipped).find("checksum mismatch"), std::string::npos);
  EXPECT_NE(why_not(std::string(good).erase(100, 8)).find("do not add up"), std::string::npos);  // bytes lost inside
  EXPECT_NE(why_not(good.substr(0, good.size() - 9)).find("not a ptrain sample cache"),
            std::string::npos);  // cut short
  EXPECT_NE(why_not(good.substr(0, 50)).find("shorter than its trailer"), std::string::npos);
  EXPECT_NE(why_not(std::string(good.size(), 'x')).find("not a ptrain sample cache"), std::string::npos);
  test::write_text(key.path, good);
  EXPECT_TRUE(open_sample_cache(key, data, nullptr));
}

// A JSON array of records (alpaca_data.json, ShareGPT dumps) holds the same records as JSONL:
// the same samples whatever its layout (one line, pretty-printed; strings holding brackets,
// commas, quotes and backslashes) and wherever the blocks cut it, in memory and through the
// cache; each sample names its element.
TEST(Samples, AJsonArrayHoldsTheSameSamplesAsJsonl) {
  test::TempDir dir;
  const std::vector<std::string> records{
      R"({"instruction": "Add [1, 2] and {3}.", "input": "", "output": "\"6\", a \\ backslash ]"})",
      R"({"conversations": [{"from": "human", "value": "hi, ]}{ there"}, {"from": "gpt", "value": "hello"}]})",
      R"({"text": "plain text with \u00e9, a comma and \"[\""})",
      R"({"prompt": "p", "completion": "c"})",
  };
  std::string jsonl, one_line = "[", pretty = " \n[\n";
  for (size_t i = 0; i < records.size(); ++i) {
    jsonl += records[i] + "\n";
    one_line += (i ? "," : "") + records[i];
    pretty += "  " + records[i] + (i + 1 < records.size() ? " ,\n" : "\n");
  }
  one_line += "]";
  pretty += "]\n";
  test::write_text(dir / "r.jsonl", jsonl);
  const SampleSet want = load(dir / "r.jsonl");
  ASSERT_EQ(want.size(), 4);
  for (const auto& [name, text] :
       {std::pair<std::string, std::string>{"one_line.json", one_line}, {"pretty.json", pretty}}) {
    test::write_text(dir / name, text);
    for (int64_t block : {int64_t{1} << 20, int64_t{7}}) {
      SampleOptions o = options();
      o.block_bytes = block;
      const SampleSet got = SampleSet::from_file(dir / name, DataFormat::json, tok(), format(), o);
      expect_same_set(got, want, name + ", blocks of " + std::to_string(block) + " bytes");
      EXPECT_EQ(got.where(3), dir / name + ": record 4");
    }
    const SampleCacheKey key =
        sample_cache_key(dir / "cache", dir / name, DataFormat::json, tok(), format(), options());
    EXPECT_NE(key.hash,
              sample_cache_key(dir / "cache", dir / name, DataFormat::jsonl, tok(), format(), options()).hash);
    build_sample_cache(key, dir / name, DataFormat::json, tok(), format(), options(), nullptr);
    const SampleSet mapped = open_sample_cache(key, dir / name, nullptr).value();
    expect_same_set(mapped, want, name + ", mapped");
    EXPECT_EQ(mapped.where(0), dir / name + ": record 1");
  }
}

// A file that is not one JSON array is refused naming the line; a bad element, naming it.
TEST(Samples, AFileThatIsNotOneJsonArrayIsRefusedNamingWhere) {
  test::TempDir dir;
  const std::vector<std::pair<std::string, std::string>> cases{
      {"{\"text\": \"a\"}\n{\"text\": \"b\"}\n", "file.json:1: expected '[' (a JSON array) first, found '{'"},
      {"[{\"text\": \"a\"},\n]", "file.json:2: a ',' before the closing ']'"},
      {"[,{\"text\": \"a\"}]", "file.json:1: an element is missing before ','"},
      {"[{\"text\": \"a\"}]\n]", "file.json:2: text after the array's closing ']': ']'"},
      {"[{\"text\": \"a\"}\n", "file.json:2: the file ends before the array's closing ']'"},
      {"[{\"text\": \"a]", "file.json:1: the file ends inside a string"},
      {"[\n{\"text\": \"a\"}}]", "file.json:2: '}' closes a bracket element 1 never opened"},
      {" \n ", "file.json:2: the file holds no JSON array"},
      {"[{\"text\": \"a\"}\n {\"text\": \"b\"}]", "file.json: record 1: not valid JSON"},
      {"[{\"text\": \"a\"}, 1]", "file.json: record 2: "},
      {"[{\"text\": \"a\"},\n\n{\"text\": 42}]", "file.json: record 2: "},
  };
  for (const auto& [text, why] : cases) {
    test::write_text(dir / "file.json", text);
    try {
      SampleSet::from_file(dir / "file.json", DataFormat::json, tok(), format(), options());
      ADD_FAILURE() << "accepted: " << text;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// Text records need no chat template, as transformers reads none for them: with a tokenizer
// directory that has none (a base model's), text, prompt/completion and text preference records
// are tokenized; the file's first chat stops the run naming the missing template, even with
// data.on_bad_record = "skip" (the record is not malformed).
TEST(SampleSet, TextNeedsNoChatTemplateAndAChatWithoutOneStopsTheRun) {
  test::TempDir dir;
  std::filesystem::create_directory(dir / "base");
  std::filesystem::copy_file(test::fixture("hf_qwen_chat/tokenizer.json"), dir / "base/tokenizer.json");
  auto config = nlohmann::json::parse(read_text_file(test::fixture("hf_qwen_chat/tokenizer_config.json")));
  config.erase("chat_template");
  test::write_text(dir / "base/tokenizer_config.json", config.dump());
  const Tokenizer base(dir / "base");
  EXPECT_THROW(chat_format(base, ChatTemplate::automatic), RuntimeError);
  const ChatFormat f = data_chat_format(base, ChatTemplate::automatic);
  EXPECT_NE(f.unavailable.find("no chat template"), std::string::npos) << f.unavailable;
  const std::string text = R"({"text": "hello there"})"
                           "\n"
                           R"({"prompt": "Q:", "completion": " a"})"
                           "\n";
  test::write_text(dir / "text.jsonl", text);
  SampleOptions o;
  o.max_ids = 64;
  o.trl.eos = base.template_tokens().value().second;  // its tokenizer_config.json's: <|im_end|>
  const SampleSet set = SampleSet::from_jsonl(dir / "text.jsonl", base, f, o);
  ASSERT_EQ(set.size(), 2);
  EXPECT_EQ(std::vector<int32_t>(set.ids(0), set.ids(0) + set.length(0)),
            cat({base.encode("hello there"), {base.id_of("<|im_end|>").value()}}));
  test::write_text(dir / "pairs.jsonl", R"({"prompt": "Q:", "chosen": " a", "rejected": " b"})"
                                        "\n");
  SampleOptions pairs = o;
  pairs.preference = true;
  EXPECT_EQ(SampleSet::from_jsonl(dir / "pairs.jsonl", base, f, pairs).size(), 2);  // DPO
  pairs.trl.cpo = true;
  EXPECT_EQ(SampleSet::from_jsonl(dir / "pairs.jsonl", base, f, pairs).size(), 2);  // SimPO
  test::write_text(dir / "mixed.jsonl", text + R"({"messages": [{"role": "user", "content": "hi"}]})"
                                               "\n");
  o.skip_bad_records = true;
  try {
    SampleSet::from_jsonl(dir / "mixed.jsonl", base, f, o);
    ADD_FAILURE() << "a chat was tokenized without a chat template";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("mixed.jsonl:3: a chat record, and no chat template in"), std::string::npos)
        << e.what();
  }
}

// Preference records (training.objective dpo / simpo): what TRL's tokenization gives is proven
// against TRL itself by sweep.preference_trl; here, the pieces it is built of, the cuts and the
// refusals.
TEST(Preference, APairIsTwoSamplesTrainedAfterThePromptTheyShare) {
  const std::string record =
      R"({"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "yes"}],)"
      R"( "rejected": [{"role": "assistant", "content": "no no"}]})";
  const PreferencePair p = render_preference(tok(), format(), {}, record);
  const std::vector<int32_t> prompt = render_prompt(tok(), format(), {{"user", "hi"}});
  EXPECT_EQ(p.prompt_ids, static_cast<int64_t>(prompt.size()));
  EXPECT_EQ(p.chosen.ids, render_chat(tok(), format(), {{"user", "hi"}, {"assistant", "yes"}}, true).ids);
  EXPECT_EQ(p.rejected.ids, render_chat(tok(), format(), {{"user", "hi"}, {"assistant", "no no"}}, true).ids);
  for (const Sample* s : {&p.chosen, &p.rejected})
    for (size_t t = 0; t < s->ids.size(); ++t) EXPECT_EQ(s->trained[t], t >= prompt.size() ? 1 : 0) << t;
  // The same chats with the prompt left implicit: the turns they share.
  const std::string implicit =
      R"({"chosen": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yes"}],)"
      R"( "rejected": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "no no"}]})";
  const PreferencePair q = render_preference(tok(), format(), {}, implicit);
  EXPECT_EQ(q.chosen.ids, p.chosen.ids);
  EXPECT_EQ(q.rejected.trained, p.rejected.trained);
  // Text: the prompt's ids, then the completion and the eos_token (added once).
  const PreferencePair t = render_preference(tok(), format(), {false, "", "<|eot_id|>"},
                                             R"({"prompt": "Q:", "chosen": " a<|eot_id|>", "rejected": " b"})");
  EXPECT_EQ(t.chosen.ids, tok().encode_with_special_tokens("Q: a<|eot_id|>"));
  EXPECT_EQ(t.rejected.ids, tok().encode_with_special_tokens("Q: b<|eot_id|>"));
  EXPECT_EQ(t.prompt_ids, static_cast<int64_t>(tok().encode_with_special_tokens("Q:").size()));
}

// SimPO pairs (TRL's CPOTrainer): text encoded without special tokens, the completion from
// where the prompt's tokens end, the bos_token and eos_token added by id where missing.
TEST(Preference, CpoPairsAreTextWithBosAndEosAddedWhereMissing) {
  const int32_t bos = id("<|begin_of_text|>"), eos = id("<|end_of_text|>");
  const TrlTokenization cpo{true, "<|begin_of_text|>", "<|end_of_text|>"};
  const std::string text = R"({"prompt": "Q:", "chosen": " a", "rejected": " b<|end_of_text|>"})";
  const PreferencePair t = render_preference(tok(), format(), cpo, text);
  const size_t prompt = 1 + tok().encode("Q:").size();
  EXPECT_EQ(t.chosen.ids, cat({{bos}, tok().encode("Q: a"), {eos}}));
  EXPECT_EQ(t.rejected.ids, cat({{bos}, tok().encode("Q: b<|end_of_text|>")}));  // the eos_token once
  EXPECT_EQ(t.prompt_ids, static_cast<int64_t>(prompt));
  EXPECT_FALSE(t.prompt_diverged);
  for (const Sample* s : {&t.chosen, &t.rejected})
    for (size_t i = 0; i < s->ids.size(); ++i) EXPECT_EQ(s->trained[i], i >= prompt ? 1 : 0) << i;
  // A tokenizer without a bos_token: none.
  EXPECT_EQ(render_preference(tok(), format(), {true, "", "<|end_of_text|>"}, text).chosen.ids,
            cat({tok().encode("Q: a"), {eos}}));
  // Chats as their template's text: the eos_token after the reply's end of turn, and not the
  // bos_token the template opens with a second time.
  const std::string chat =
      R"({"prompt": [{"role": "user", "content": "hi"}], "chosen": [{"role": "assistant", "content": "yes"}],)"
      R"( "rejected": [{"role": "assistant", "content": "no no"}]})";
  const std::vector<ChatMessage> turns{{"user", "hi"}, {"assistant", "yes"}};
  const std::vector<int32_t> whole = render_chat(tok(), format(), turns, true).ids;
  EXPECT_EQ(tok().encode(chat_text(format(), turns, false)), whole);  // the text render_chat's ids encode
  EXPECT_EQ(tok().encode(chat_text(format(), {{"user", "hi"}}, true)),
            render_prompt(tok(), format(), {{"user", "hi"}}));
  const PreferencePair c = render_preference(tok(), format(), cpo, chat);
  EXPECT_EQ(c.chosen.ids, cat({whole, {eos}}));
  EXPECT_EQ(c.prompt_ids, static_cast<int64_t>(render_prompt(tok(), format(), {{"user", "hi"}}).size()));
  // ... and with <|eot_id|> as the eos_token, which the reply already ends with, nothing.
  EXPECT_EQ(render_preference(tok(), format(), {true, "<|begin_of_text|>", "<|eot_id|>"}, chat).chosen.ids, whole);
  // A prompt whose last token merges with the completion's first: the completion starts one
  // token earlier (build_tokenized_answer).
  const std::vector<int32_t> alone = tok().encode("Q: "), merged = tok().encode("Q: answer");
  ASSERT_NE(merged.at(alone.size() - 1), alone.back());  // "Ġ" + "answer" begins "Ġa"
  const PreferencePair m =
      render_preference(tok(), format(), cpo, R"({"prompt": "Q: ", "chosen": "answer", "rejected": "no"})");
  EXPECT_TRUE(m.prompt_diverged);
  EXPECT_EQ(m.chosen.ids, cat({{bos}, merged, {eos}}));
  EXPECT_EQ(m.chosen.trained[alone.size()], 1);  // after bos and the prompt's tokens but its last
  EXPECT_EQ(m.chosen.trained[alone.size() - 1], 0);
  // ... and one whose tokens outnumber the whole's (" t" "h" + "e" is " the"): refused, as by TRL.
  EXPECT_THROW(render_preference(tok(), format(), cpo, R"({"prompt": "Q: th", "chosen": "e", "rejected": "is"})"),
               RuntimeError);
  // An eos_token or bos_token the tokenizer lacks is refused by name.
  for (const TrlTokenization& bad : {TrlTokenization{true, "", ""}, TrlTokenization{true, "", "<nope>"},
                                     TrlTokenization{true, "<nope>", "<|end_of_text|>"}}) {
    try {
      render_preference(tok(), format(), bad, text);
      ADD_FAILURE() << "accepted eos " << bad.eos << " bos " << bad.bos;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(bad.eos.empty() ? "eos_token" : "<nope>"), std::string::npos) << e.what();
    }
  }
}

TEST(Preference, RecordsPtrainCannotReadAreRefusedByName) {
  const auto why = [](const std::string& record, const std::string& eos = "<|eot_id|>") {
    try {
      render_preference(tok(), format(), {false, "", eos}, record);
    } catch (const RuntimeError& e) {
      return std::string(e.what());
    }
    return std::string("accepted");
  };
  EXPECT_NE(why(R"({"prompt": "a", "chosen": "b"})").find("needs \"chosen\" and \"rejected\""), std::string::npos);
  EXPECT_NE(why(R"({"prompt": "a", "chosen": "b", "rejected": [{"role": "assistant", "content": "c"}]})")
                .find("all be strings or all message lists"),
            std::string::npos);
  EXPECT_NE(why(R"({"prompt": "a", "chosen": "b", "rejected": "c", "score": 3})").find("\"score\""), std::string::npos);
  EXPECT_NE(why(R"({"prompt": "a", "chosen": "b", "rejected": "c"})", "").find("eos_token"), std::string::npos);
  EXPECT_NE(why(R"({"chosen": "", "rejected": "c"})").find("empty"), std::string::npos);
  EXPECT_NE(why(R"({"chosen": "x ", "rejected": "y"})").find("share no prompt"), std::string::npos);
  EXPECT_NE(why(R"({"prompt": [{"role": "assistant", "content": "a"}], "chosen": [], "rejected": []})")
                .find("must end with a user message"),
            std::string::npos);
  EXPECT_NE(why(R"({"prompt": "a", "chosen": "b", "rejected": "c", "tools": []})")
                .find("\"tools\" go with a conversational pair"),
            std::string::npos);
}

// Without a prompt, the turns chosen and rejected share are the prompt — compared as Python's
// dicts are (TRL's extract_prompt), whatever the order of their keys.
TEST(Preference, TheSharedTurnsAreFoundWhateverTheOrderOfTheirKeys) {
  const TrlTokenization how{false, "", "<|eot_id|>"};
  const PreferencePair a =
      render_preference(tok(), format(), how,
                        R"({"chosen": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "yes"}],
          "rejected": [{"content": "q", "role": "user"}, {"role": "assistant", "content": "no"}]})");
  const PreferencePair b = render_preference(
      tok(), format(), how,
      R"({"prompt": [{"role": "user", "content": "q"}], "chosen": [{"role": "assistant", "content": "yes"}],
          "rejected": [{"role": "assistant", "content": "no"}]})");
  EXPECT_EQ(a.chosen.ids, b.chosen.ids);
  EXPECT_EQ(a.rejected.ids, b.rejected.ids);
  EXPECT_EQ(a.prompt_ids, b.prompt_ids);
}

TEST(Preference, PairsAreCutAsTrlCutsThemAndRowsHoldChosenThenRejected) {
  test::TempDir dir;
  std::string lines;
  for (int i = 0; i < 5; ++i)
    lines += R"({"prompt": "question )" + std::to_string(i) + R"(:", "chosen": " )" +
             std::string(static_cast<size_t>(1 + 3 * i), 'a') +
             R"(", "rejected": " b"})"
             "\n";
  lines += R"({"prompt": ")" + std::string(200, 'q') +
           R"(", "chosen": " a", "rejected": " b"})"
           "\n";  // the prompt alone fills max_ids
  test::write_text(dir / "pairs.jsonl", lines);
  SampleOptions o = options();
  o.preference = true;
  o.trl.eos = "<|eot_id|>";
  o.max_ids = 12;
  const auto set = std::make_shared<SampleSet>(load(dir / "pairs.jsonl", o));
  EXPECT_EQ(set->stats.pairs, 5);
  EXPECT_EQ(set->stats.dropped_prompt_fills, 1);
  ASSERT_EQ(set->size(), 10);
  int64_t cut = 0;
  for (int64_t i = 0; i < set->size(); ++i) {
    EXPECT_LE(set->length(i), 12);
    cut += set->length(i) == 12 ? 1 : 0;
  }
  EXPECT_GT(cut, 0);
  EXPECT_GT(set->stats.truncated, 0);
  PairRows rows(set, SampleSplit{{0, 1, 2, 3}, {4}}, 11, 7);
  EXPECT_EQ(rows.val_rows(), 1);
  // An epoch is every training pair once; pair k's chosen is row k, its rejected row P + k.
  const Batch b = rows.train_rows(0, 4);
  ASSERT_EQ(b.inputs.size(0), 8);
  std::set<int64_t> seen;
  for (int64_t r = 0; r < 4; ++r) {
    int64_t pair = -1;
    for (int64_t p = 0; p < 4; ++p)
      if (b.inputs[r][0].item<int64_t>() == set->ids(2 * p)[0] &&
          at::equal(b.inputs[r].slice(0, 0, set->length(2 * p) - 1),
                    at::tensor(std::vector<int64_t>(set->ids(2 * p), set->ids(2 * p) + set->length(2 * p) - 1))))
        pair = p;
    ASSERT_GE(pair, 0) << r;
    seen.insert(pair);
    const int64_t n = set->length(2 * pair + 1);
    const at::Tensor rejected =
        at::tensor(std::vector<int64_t>(set->ids(2 * pair + 1), set->ids(2 * pair + 1) + n - 1));
    EXPECT_TRUE(at::equal(b.inputs[4 + r].slice(0, 0, n - 1), rejected)) << r;
    EXPECT_EQ(b.targets[4 + r].ne(kIgnoreIndex).sum().item<int64_t>(), set->trained_count(2 * pair + 1));
  }
  EXPECT_EQ(seen.size(), 4u);
}

namespace {

// The qwen2.5-tools fixture tokenizer (Qwen2.5's <tool_call> flags) in `dir` with `tmpl` as its chat template.
Tokenizer qwen_with_template(const test::TempDir& dir, const std::string& tmpl) {
  const std::string src = test::fixture("chat_templates/qwen2.5-tools");
  std::filesystem::copy_file(src + "/tokenizer.json", dir / "tokenizer.json",
                             std::filesystem::copy_options::overwrite_existing);
  auto config = nlohmann::json::parse(read_text_file(src + "/tokenizer_config.json"));
  config["chat_template"] = tmpl;
  test::write_text(dir / "tokenizer_config.json", config.dump());
  return Tokenizer(dir.path);
}

const nlohmann::json& tool_fixture() {
  static const nlohmann::json f = nlohmann::json::parse(read_text_file(test::fixture("tool_chats_expected.json")));
  return f;
}

}  // namespace

// Python's json.dumps (the `tojson` a template renders tools and arguments with) on awkward values
// (tests/fixtures/make_tool_chat_fixtures.py): key order and a repeated key as json.loads keeps
// them, every float form (1e-05, 1e+16, 1000000000000000.0, -0.0, 5e-324), 64-bit integers,
// escapes, non-ASCII written as is; on one line and with indent=4 (Llama 3.1's `tojson(indent=4)`:
// empty containers stay "[]" and "{}").
TEST(PythonJson, WritesWhatJsonDumpsWrites) {
  for (const auto& c : tool_fixture().at("json"))
    EXPECT_EQ(python_json(nlohmann::ordered_json::parse(c[0].get<std::string>())), c[1].get<std::string>())
        << c[0].get<std::string>();
  for (const auto& c : tool_fixture().at("json_indent"))
    EXPECT_EQ(python_json(nlohmann::ordered_json::parse(c[0].get<std::string>()), 4), c[1].get<std::string>())
        << c[0].get<std::string>();
  // an integer past 64 bits parses as a float, which Python would write as an integer: found
  EXPECT_EQ(wide_json_integer(R"({"a": [1e30, 18446744073709551615, -9223372036854775809]})"), "-9223372036854775809");
  EXPECT_EQ(wide_json_integer(R"({"a": [1e30, 1.0, 18446744073709551615, -9223372036854775808]})"), "");
}

// Chats with tools, tool calls and tool results render as transformers' apply_chat_template renders
// them with Qwen2.5's released template, Qwen3's first release and Llama 3.1's and 3.2's released
// templates (tests/fixtures/make_tool_chat_fixtures.py): the ids, and a loss on each reply — tool
// calls included — from after its "<|im_start|>assistant\n" through its "<|im_end|>\n" (Llama's:
// after its assistant header through its "<|eot_id|>"); tool results and the tool definitions are
// not trained; a chat the template raises on (Qwen3's on a call without content, Llama's on two
// calls in a reply, an empty list of them, a call outside "function", tools and no user message) is
// refused, and so is the one Llama's renders a tool result of as the user message holding the tools.
// Llama's drops a reply's text beside its call: counted in the dataset report. Qwen2.5's, Llama
// 3.1's and 3.2's the same with data.chat_template naming them over a directory whose template has
// no tool branches.
TEST(ToolChats, RenderAsTransformersWithTheReleasedTemplatesOfQwenAndLlama) {
  test::TempDir plain_dir;
  const Tokenizer plain_qwen = qwen_with_template(plain_dir, "{{ 'no tools' }}");
  const Tokenizer plain_llama31(test::fixture("chat_templates/llama3.1"));  // ptrain's, without tool branches
  const Tokenizer plain_llama32(test::fixture("chat_templates/llama3.2"));
  const std::map<std::string, std::pair<std::string, const Tokenizer*>> released{
      {"qwen2.5", {"Qwen2.5 / Qwen2 Instruct (as released)", &plain_qwen}},
      {"qwen3", {"Qwen3 (first release)", nullptr}},
      {"llama3.1", {"Llama 3.1 / 3.3 Instruct (as released)", &plain_llama31}},
      {"llama3.2", {"Llama 3.2 Instruct (as released)", &plain_llama32}},
      {"mistral-nemo", {"Mistral Nemo Instruct 2407", nullptr}}};
  std::map<std::string, int> rendered, refused, call_text_dropped;
  for (const auto& [name, fixture] : tool_fixture().at("templates").items()) {
    const Tokenizer tok(test::fixture(fixture.at("tokenizer").get<std::string>()));  // the released template
    ChatFormat automatic = chat_format(tok, ChatTemplate::automatic);
    ASSERT_TRUE(automatic.tools) << automatic.no_tools;
    EXPECT_NE(automatic.source.find(released.at(name).first), std::string::npos) << automatic.source;
    // data.chat_template naming the template: over a tokenizer whose own template has no tool
    // branches (Nemo's fixture tokenizer with its control tokens has only the released one)
    const Tokenizer* plain = name == "mistral-nemo" ? &tok : released.at(name).second;
    std::optional<ChatFormat> named;
    if (plain) {
      named = chat_format(*plain, automatic.kind);
      if (name != "qwen2.5" && name != "mistral-nemo") {  // recognized, without tool branches (Qwen's: none known)
        EXPECT_FALSE(chat_format(*plain, ChatTemplate::automatic).tools) << name;
      }
    }
    automatic.date = "26 Jul 2024";  // Llama 3.2's strftime_now, as the fixture's date_string
    if (named) named->date = automatic.date;
    for (const auto& r : fixture.at("records")) {
      const std::string line = r.at("line");
      SampleStats stats;
      if (r.contains("error") || r.contains("ptrain_refuses")) {
        for (const ChatFormat* f : {&automatic, named ? &*named : nullptr}) {
          if (!f) continue;
          try {
            render_record(f == &automatic ? tok : *plain, *f, {}, line, false, stats);
            ADD_FAILURE() << name << ": rendered " << line;
          } catch (const RuntimeError& e) {
            if (r.contains("ptrain_refuses")) {
              EXPECT_NE(std::string(e.what()).find(r.at("ptrain_refuses").get<std::string>()), std::string::npos)
                  << e.what();
            }
          }
        }
        ++refused[name];
        continue;
      }
      const auto labels = r.at("labels").get<std::vector<int64_t>>();
      for (const ChatFormat* f : {&automatic, named ? &*named : nullptr}) {
        if (!f) continue;
        SampleStats one;
        const Sample s = render_record(f == &automatic ? tok : *plain, *f, {}, line, false, one);
        EXPECT_EQ(s.ids, r.at("ids").get<std::vector<int32_t>>()) << name << ": " << line;
        ASSERT_EQ(s.trained.size(), labels.size()) << line;
        for (size_t t = 0; t < labels.size(); ++t)
          EXPECT_EQ(static_cast<bool>(s.trained[t]), labels[t] != -100) << name << ": " << line << " at " << t;
        if (f == &automatic) call_text_dropped[name] += static_cast<int>(one.call_text_dropped);
      }
      ++rendered[name];
    }
    for (const auto& p : fixture.at("prompts")) {
      const auto record = nlohmann::ordered_json::parse(p.at("line").get<std::string>());
      std::vector<std::string> tools;
      for (const auto& t : record.at("tools")) tools.push_back(python_json(t));
      const std::string text = chat_text(automatic, chat_turns(record.at("messages")), true, tools);
      EXPECT_EQ(tok.encode(text), p.at("ids").get<std::vector<int32_t>>()) << name;
    }
  }
  // each template renders the 2 records whose tools are a string holding JSON (TRL decodes it) and
  // refuses the one whose string is not JSON; Qwen3's 2 more refusals: a call with no content;
  // Llama's 5: two calls, an empty list, a call outside "function", no user message, a tool result
  // first (ptrain_refuses); Nemo's 8: ids not of 9 characters, a tool without "function", a call
  // outside it, an empty list (ptrain_refuses)
  EXPECT_EQ(rendered, (std::map<std::string, int>{
                          {"qwen2.5", 8}, {"qwen3", 8}, {"llama3.1", 9}, {"llama3.2", 9}, {"mistral-nemo", 7}}));
  EXPECT_EQ(refused, (std::map<std::string, int>{
                         {"qwen2.5", 1}, {"qwen3", 3}, {"llama3.1", 6}, {"llama3.2", 6}, {"mistral-nemo", 9}}));
  // one reply with text beside its call ("Checking."), in each Llama template's chats and Nemo's
  EXPECT_EQ(call_text_dropped,
            (std::map<std::string, int>{
                {"qwen2.5", 0}, {"qwen3", 0}, {"llama3.1", 1}, {"llama3.2", 1}, {"mistral-nemo", 1}}));
}

// Text records ({"text"}, {"prompt": "...", "completion": "..."}) as TRL's SFTTrainer tokenizes
// them (tests/fixtures/make_trl_fixtures.py, trl 1.16, the tokenizer_dirs fixtures as AutoTokenizer
// reads them): tokenizer(text + eos_token) with its post-processor's BOS, the eos_token not added
// twice, and a loss after the common prefix of tokenizer(prompt) and the whole — where newlines
// merge across the boundary, the prompt is no prefix and is counted.
TEST(Samples, TextRecordsAsTrlsSftTrainerTokenizesThem) {
  const auto fixture = nlohmann::json::parse(read_text_file(test::fixture("trl_tokenized_expected.json")));
  int compared = 0, diverged = 0;
  for (const auto& [name, t] : fixture.at("sft_text").items()) {
    const Tokenizer tok(test::fixture(t.at("tokenizer").get<std::string>()));
    const ChatFormat f = data_chat_format(tok, ChatTemplate::automatic);
    TrlTokenization how;
    std::tie(how.bos, how.eos) = tok.template_tokens().value();
    for (const auto& r : t.at("records")) {
      const std::string line = r.at("line");
      SampleStats stats;
      const Sample s = render_record(tok, f, how, line, false, stats);
      EXPECT_EQ(s.ids, r.at("ids").get<std::vector<int32_t>>()) << name << ": " << line;
      const auto labels = r.at("labels").get<std::vector<int64_t>>();
      ASSERT_EQ(s.trained.size(), labels.size()) << name << ": " << line;
      for (size_t i = 0; i < labels.size(); ++i)
        EXPECT_EQ(static_cast<bool>(s.trained[i]), labels[i] != -100) << name << ": " << line << " at " << i;
      const bool pair = r.contains("prompt_diverged");
      EXPECT_EQ(stats.prompt_completion + stats.text, 1);
      EXPECT_EQ(stats.prompt_completion, pair ? 1 : 0) << line;
      EXPECT_EQ(stats.prompt_diverged, pair && r.at("prompt_diverged").get<bool>() ? 1 : 0) << name << ": " << line;
      diverged += static_cast<int>(stats.prompt_diverged);
      const Sample all = render_record(tok, f, how, line, /*train_on_prompt=*/true, stats);
      EXPECT_EQ(all.ids, s.ids);
      EXPECT_EQ(std::count(all.trained.begin(), all.trained.end(), 1), static_cast<std::ptrdiff_t>(all.ids.size()));
      ++compared;
    }
  }
  EXPECT_EQ(compared, 36);
  EXPECT_EQ(diverged, 4);
  // a tokenizer naming no eos_token (a bare tokenizer.json): TRL's SFTTrainer cannot append it —
  // the run's problem, not the records': data.on_bad_record = "skip" does not skip them
  test::TempDir dir;
  test::write_text(dir / "text.jsonl", "{\"text\": \"hi\"}\n");
  SampleOptions skip;
  skip.skip_bad_records = true;
  try {
    SampleSet::from_jsonl(dir / "text.jsonl", tok(), format(), skip);
    ADD_FAILURE() << "a text record was skipped or rendered without an eos_token";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("text.jsonl:1: a text record (or text completion) ends"), std::string::npos)
        << e.what();
  }
  SampleStats stats;
  for (const char* line : {R"({"text": "hi"})", R"({"prompt": "Q", "completion": " A"})"}) {
    try {
      render_record(tok(), format(), {}, line, false, stats);
      ADD_FAILURE() << "rendered " << line;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("ends with the tokenizer's eos_token, as TRL's trainers add it, and this "
                                           "tokenizer names none: point data.tokenizer at the model directory"),
                std::string::npos)
          << e.what();
    }
  }
}

// Conversational prompt/completion records ({"prompt": [turns], "completion": [turns]}, "tools" too)
// as TRL's SFTTrainer tokenizes them (tests/fixtures/make_trl_fixtures.py, trl 1.16): the whole
// chat's ids and a loss on every token after the prompt's rendering with the generation prompt
// (where the two part: DeepSeek-R1's prompt ends "<think>\n", its replies do not) — a completion's
// user turn and tool results included, as TRL's completion_mask has them — over the released
// templates of Qwen2.5, Qwen3, Llama 3.1, Mistral Nemo, DeepSeek-R1's and Mistral v0.3's.
TEST(Samples, ConversationalPromptCompletionRecordsAsTrlsSftTrainerTokenizesThem) {
  const auto fixture = nlohmann::json::parse(read_text_file(test::fixture("trl_tokenized_expected.json")));
  int compared = 0;
  for (const auto& [name, t] : fixture.at("sft").items()) {
    const Tokenizer tok(test::fixture(t.at("tokenizer").get<std::string>()));
    const ChatFormat f = chat_format(tok, ChatTemplate::automatic);
    for (const auto& r : t.at("records")) {
      const std::string line = r.at("line");
      SampleStats stats;
      if (r.contains("error")) {
        EXPECT_THROW(render_record(tok, f, {}, line, false, stats), RuntimeError) << name << ": " << line;
        continue;
      }
      const Sample s = render_record(tok, f, {}, line, false, stats);
      EXPECT_EQ(s.ids, r.at("ids").get<std::vector<int32_t>>()) << name << ": " << line;
      const auto labels = r.at("labels").get<std::vector<int64_t>>();
      ASSERT_EQ(s.trained.size(), labels.size()) << name << ": " << line;
      for (size_t i = 0; i < labels.size(); ++i)
        EXPECT_EQ(static_cast<bool>(s.trained[i]), labels[i] != -100) << name << ": " << line << " at " << i;
      EXPECT_EQ(stats.chat, 1);
      const Sample all = render_record(tok, f, {}, line, /*train_on_prompt=*/true, stats);
      EXPECT_EQ(std::count(all.trained.begin(), all.trained.end(), 1), static_cast<std::ptrdiff_t>(all.ids.size()));
      ++compared;
    }
  }
  EXPECT_EQ(compared, 34);
  // both lists or both strings; no other field
  SampleStats stats;
  const Tokenizer tok(test::fixture("chat_templates/qwen2.5-tools"));
  const ChatFormat f = chat_format(tok, ChatTemplate::automatic);
  for (const auto& [line, why] : std::vector<std::pair<std::string, std::string>>{
           {R"({"prompt": [{"role": "user", "content": "hi"}], "completion": "yo"})", "must both be message lists"},
           {R"({"prompt": [{"role": "user", "content": "hi"}], "completion": [{"role": "assistant", "content": "yo"}],
               "id": 3})",
            "a conversational prompt/completion record holds \"id\""},
           {R"({"prompt": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}],
               "completion": [{"role": "assistant", "content": "yo"}]})",
            "a prompt to answer must end with a user message or a tool result"}}) {
    try {
      render_record(tok, f, {}, line, false, stats);
      ADD_FAILURE() << "rendered " << line;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  }
}

// DPO pairs with tools, tool calls and tool results as TRL's DPOTrainer tokenizes them
// (tests/fixtures/make_trl_fixtures.py, trl 1.16): the record's tools rendered (a list, or a JSON
// string decoded), a call chosen over a guess, answers after a call and its result in the prompt,
// the prompt left implicit — over the released templates of Qwen2.5, Qwen3, Llama 3.1 and Mistral
// Nemo: each side = TRL's prompt_ids + its completion's ids, trained after the prompt. CPO / SimPO /
// ORPO pairs with tools are refused (TRL's CPOTrainer and ORPOTrainer pass no tools).
TEST(Preference, DpoPairsWithToolsAsTrlsDpoTrainerTokenizesThem) {
  const auto fixture = nlohmann::json::parse(read_text_file(test::fixture("trl_tokenized_expected.json")));
  int compared = 0;
  for (const auto& [name, t] : fixture.at("dpo").items()) {
    const Tokenizer tok(test::fixture(t.at("tokenizer").get<std::string>()));
    const ChatFormat f = chat_format(tok, ChatTemplate::automatic);
    for (const auto& r : t.at("records")) {
      const std::string line = r.at("line");
      const PreferencePair p = render_preference(tok, f, {}, line);
      const auto prompt = r.at("prompt_ids").get<std::vector<int32_t>>();
      for (const auto& [side, sample] : {std::pair{"chosen_ids", &p.chosen}, std::pair{"rejected_ids", &p.rejected}}) {
        std::vector<int32_t> want = prompt;
        for (int32_t id : r.at(side).get<std::vector<int32_t>>()) want.push_back(id);
        EXPECT_EQ(sample->ids, want) << name << " " << side << ": " << line;
        for (size_t i = 0; i < sample->trained.size(); ++i)
          EXPECT_EQ(sample->trained[i], i >= prompt.size() ? 1 : 0) << name << " " << side << " at " << i;
      }
      EXPECT_EQ(p.prompt_ids, static_cast<int64_t>(prompt.size())) << name << ": " << line;
      ++compared;
      if (line.find("tool") == std::string::npos) continue;
      try {
        render_preference(tok, f, {true, "", "<|im_end|>"}, line);
        ADD_FAILURE() << "a CPO pair with tools rendered: " << line;
      } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find("in a CPO / SimPO / ORPO pair"), std::string::npos) << e.what();
      }
    }
  }
  EXPECT_EQ(compared, 16);
}

// Chats with tools in Parquet (written by pyarrow): struct columns hold every field of every turn,
// call and argument object, null where a record lacks it; the rows render as transformers renders
// them as pyarrow (HF datasets) reads them — the struct fields in their schema's order, a null
// turn field absent, a null argument rendered.
TEST(ToolChats, ParquetRowsRenderAsTheirStructsSpell) {
  if (!parquet_supported()) GTEST_SKIP() << "built without Parquet support (no pyarrow in the venv)";
  const Tokenizer tok(test::fixture("chat_templates/qwen2.5-tools"));
  const SampleSet got = SampleSet::from_parquet(test::fixture("parquet/tools.parquet"), tok,
                                                chat_format(tok, ChatTemplate::automatic), {});
  const auto& want = tool_fixture().at("parquet");
  ASSERT_EQ(got.size(), static_cast<int64_t>(want.size()));
  for (int64_t i = 0; i < got.size(); ++i) {
    EXPECT_EQ(ids_of(got, i), want[static_cast<size_t>(i)].at("ids").get<std::vector<int32_t>>()) << "row " << i + 1;
    const auto labels = want[static_cast<size_t>(i)].at("labels").get<std::vector<int64_t>>();
    const std::vector<uint8_t> trained = trained_of(got, i);
    ASSERT_EQ(trained.size(), labels.size());
    for (size_t t = 0; t < labels.size(); ++t) EXPECT_EQ(static_cast<bool>(trained[t]), labels[t] != -100) << t;
  }
}

// A chat with tools is rendered only by a template whose tool branches are the released Qwen2.5 or
// Qwen3 ones, token for token; anywhere else it is refused naming why (the chat's plain turns still
// render): Qwen3's later template (`content is string` guards) too, whose tool branches ptrain has
// not compared.
// Records whose tool parts ptrain does not read are refused naming the field.
TEST(ToolChats, AreRefusedByTemplatesThatRenderThemOtherwiseAndMalformedOnesByName) {
  const auto& qwen25 = tool_fixture().at("templates").at("qwen2.5");
  const std::string tool_chat = qwen25.at("records")[1].at("line");
  const std::string plain_chat =
      R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})";
  const std::string released = qwen25.at("template");
  auto edit = [&](const std::string& from, const std::string& to) {
    std::string t = released;
    const size_t at = t.find(from);
    EXPECT_NE(at, std::string::npos) << from;
    return t.replace(at, from.size(), to);
  };
  test::TempDir edited_dir, moved_dir, text_dir;
  const Tokenizer texted =
      qwen_with_template(text_dir, edit("{%- for tool in tools %}", "Tools:\n{%- for tool in tools %}"));
  const Tokenizer qwen3_later(test::fixture("chat_templates/qwen3"));  // ptrain's Qwen3 template, guarded
  const Tokenizer plain(test::fixture("chat_templates/qwen2.5"));      // Qwen2.5's template without tool branches
  const Tokenizer edited = qwen_with_template(edited_dir, edit("'\\n</tool_response>'", "'\\n</tool_result>'"));
  const Tokenizer moved = qwen_with_template(moved_dir, edit("(loop.index0 == 0) or", "(loop.index0 == 1) or"));
  SampleStats stats;
  for (const auto& [name, t, why] : std::vector<std::tuple<std::string, const Tokenizer*, std::string>>{
           {"llama3", &tok(), "and these chats render as llama3"},
           {"Qwen2.5 plain", &plain, "its tool branches are not the released ones ptrain renders (line 1: the tag"},
           {"Qwen3's later template", &qwen3_later, "its tool branches are not the released ones ptrain renders"},
           {"text in a tool branch", &texted, "a tool branch renders text outside its tags"},
           {"a tool literal edited", &edited, "(line 46: the tag \"{{- '\\n</tool_result>' }}\""},
           {"a tool tag's number moved", &moved, "the tag \"{%- if (loop.index0 == 1) or"}}) {
    const ChatFormat f = chat_format(*t, ChatTemplate::automatic);
    EXPECT_FALSE(f.tools) << name;
    EXPECT_NO_THROW(render_record(*t, f, {}, plain_chat, false, stats)) << name;  // a chat without tools renders
    try {
      render_record(*t, f, {}, tool_chat, false, stats);
      ADD_FAILURE() << name << ": a chat with tools rendered";
    } catch (const RuntimeError& e) {
      const std::string msg = e.what();
      EXPECT_NE(msg.find("ptrain renders tools, tool calls and tool results only with the released templates of "
                         "Qwen2.5, of Qwen3 (its first release), of Llama 3.1 / 3.2 / 3.3 and of Mistral Nemo"),
                std::string::npos)
          << msg;
      EXPECT_NE(msg.find(why), std::string::npos) << name << ": " << msg;
    }
  }
  {  // a tokenizer whose <tool_call> takes the whitespace before it (lstrip): no boundary after the header
    const ChatFormat lstrip = chat_format(plain, ChatTemplate::qwen2_5);
    try {
      render_record(plain, lstrip, {}, qwen25.at("records")[0].at("line").get<std::string>(), false, stats);
      ADD_FAILURE() << "rendered with an lstrip <tool_call>";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("the tokenizer merges the start of \"<tool_call>"), std::string::npos)
          << e.what();
    }
  }
  test::TempDir dir;
  const Tokenizer qwen = qwen_with_template(dir, released);
  const ChatFormat f = chat_format(qwen, ChatTemplate::automatic);
  const std::string user = R"({"role": "user", "content": "hi"})";
  for (
      const auto& [line, why] : std::vector<std::pair<std::string, std::string>>{
          {R"({"messages": [)" + user + R"(, {"role": "assistant", "content": null}]})",
           "\"content\" must be a string"},
          {R"({"messages": [)" + user + R"(, {"role": "assistant", "content": null, "tool_calls": []}]})",
           "\"content\" must be a string"},
          {R"({"messages": [{"role": "user", "content": "x", "tool_calls": [{"name": "f", "arguments": {}}]}]})",
           "message 1 holds \"tool_calls\", which only a reply may"},
          {R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": [{"arguments": {}}]}]})",
           "message 2's tool call 1 needs \"name\" (a string) and \"arguments\""},
          {R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": [{"name": "f", "arguments": 3}]}]})",
           "message 2's tool call 1's \"arguments\" must be a JSON object"},
          {R"({"messages": [)" + user +
               R"(, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}, "strict": true}}]}]})",
           "message 2's tool call 1's function holds \"strict\""},
          {R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": [{"function": null}]}]})",
           "message 2's tool call 1's \"function\" must be a JSON object"},
          {R"({"messages": [)" + user +
               R"(, {"role": "assistant", "tool_calls": [{"function": {"name": "f", "arguments": {}}, "name": null}]}]})",
           "message 2's tool call 1 holds \"name\""},
          {R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": {"name": "f"}}]})",
           "message 2's \"tool_calls\" must be a list"},
          {R"({"messages": [)" + user + R"(, {"role": "tool", "content": "1", "weight": 0}]})",
           "message 2 holds \"weight\""},
          {R"({"messages": [)" + user + R"(], "tools": {"name": "f"}})", "\"tools\" must be a list"},
          {R"({"messages": [)" + user + R"(], "tools": ["f"]})", "each of \"tools\" must be a tool definition"},
          {R"({"messages": [)" + user + R"(], "tools": [{"x": 18446744073709551616}]})", "too large for 64 bits"},
      }) {
    try {
      render_record(qwen, f, {}, line, false, stats);
      ADD_FAILURE() << "rendered " << line;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << line << ": " << e.what();
    }
  }
  // the control: a well-formed call renders
  EXPECT_NO_THROW(render_record(
      qwen, f, {},
      R"({"messages": [)" + user + R"(, {"role": "assistant", "tool_calls": [{"name": "f", "arguments": {"n": 1}}]}]})",
      false, stats));
}

// KTO's examples as TRL's KTOTrainer prepares its train dataset (tests/fixtures/make_trl_fixtures.py,
// trl 1.16, per_device_train_batch_size 3): unpaired chats (with tools, a call, a result ending the
// prompt) over Qwen2.5's and Llama 3.1's released templates, text with the eos_token, and pairs it
// unpairs (the chosen completions first) over Qwen3's — in its order, each example's row = its
// prompt_ids + completion_ids with the completion trained, its KL row = prompt_ids +
// KL_completion_ids (each micro-batch's completions rotated by one), its label.
TEST(Preference, KtoExamplesAsTrlsKtoTrainerPreparesThem) {
  const auto fixture = nlohmann::json::parse(read_text_file(test::fixture("trl_tokenized_expected.json")));
  int compared = 0;
  for (const auto& [name, t] : fixture.at("kto").items()) {
    SCOPED_TRACE(name);
    const Tokenizer tok(test::fixture(t.at("tokenizer").get<std::string>()));
    const ChatFormat f = chat_format(tok, ChatTemplate::automatic);
    test::TempDir dir;
    std::string lines;
    for (const auto& l : t.at("lines")) lines += l.get<std::string>() + "\n";
    test::write_text(dir / "kto.jsonl", lines);
    SampleOptions o = options();
    o.preference = true;
    o.trl.kto = true;
    o.trl.eos = tok.template_tokens() ? tok.template_tokens()->second : "";
    const auto set = std::make_shared<const SampleSet>(SampleSet::from_jsonl(dir / "kto.jsonl", tok, f, o));
    SampleSplit split;
    for (int64_t r = 0; r < kto_records(*set); ++r) split.train.push_back(r);
    const int64_t T = 1024;  // Llama 3.1's tools alone are ~450 tokens
    KtoRows rows(set, split, T, T + 1, t.at("micro_batch").get<int64_t>());
    const auto& want = t.at("rows");
    ASSERT_EQ(rows.train_examples(), static_cast<int64_t>(want.size()));
    for (size_t k = 0; k < want.size(); ++k) {
      const auto prompt = want[k].at("prompt_ids").get<std::vector<int64_t>>();
      const Batch b = rows.pair_batch({static_cast<int64_t>(k)});
      EXPECT_EQ(b.labels[0].item<bool>(), want[k].at("label").get<bool>()) << "example " << k;
      for (const auto& [row, key] : {std::pair{0, "completion_ids"}, std::pair{1, "KL_completion_ids"}}) {
        std::vector<int64_t> ids = prompt;
        for (int64_t id : want[k].at(key).get<std::vector<int64_t>>()) ids.push_back(id);
        const auto n = static_cast<int64_t>(ids.size());
        const at::Tensor in = b.inputs[row], tg = b.targets[row];
        for (int64_t p = 0; p + 1 < n; ++p) {
          ASSERT_EQ(in[p].item<int64_t>(), ids[static_cast<size_t>(p)]) << key << " example " << k << " at " << p;
          const bool trained = p + 1 >= static_cast<int64_t>(prompt.size());
          ASSERT_EQ(tg[p].item<int64_t>(), trained ? ids[static_cast<size_t>(p + 1)] : kIgnoreIndex)
              << key << " example " << k << " at " << p;
        }
        EXPECT_EQ(tg.slice(0, n - 1).ne(kIgnoreIndex).sum().item<int64_t>(), 0) << key << " example " << k;
      }
      ++compared;
    }
  }
  EXPECT_EQ(compared, 29);
}

// KTO records ptrain refuses by name: no label, a label TRL would not read as a bool, a paired
// record missing a side, strings mixed with message lists.
TEST(Preference, KtoRecordsMissingTheirPartsAreRefusedByName) {
  const TrlTokenization how{false, "", "<|eot_id|>", true};
  const auto refused = [&](const std::string& line, const std::string& says) {
    try {
      render_kto(tok(), format(), how, line);
      ADD_FAILURE() << "rendered: " << line;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    }
  };
  refused(R"({"prompt": "Q:", "completion": " a"})", "needs \"prompt\", \"completion\" and \"label\"");
  refused(R"({"prompt": "Q:", "completion": " a", "label": 2})", "\"label\" must be true");
  refused(R"({"prompt": "Q:", "completion": " a", "label": "yes"})", "\"label\" must be true");
  refused(R"({"prompt": "Q:", "chosen": " a"})", "needs both \"chosen\" and \"rejected\"");
  refused(R"({"prompt": "Q:", "completion": [{"role": "assistant", "content": "a"}], "label": true})",
          "must both be strings or both message lists");
  refused(R"({"prompt": "Q:", "completion": " a", "label": true, "score": 1})", "score");
  // 1 and 0 are read as TRL reads them (torch.as_tensor(..., dtype=torch.bool))
  EXPECT_TRUE(
      render_kto(tok(), format(), how, R"({"prompt": "Q:", "completion": " a", "label": 1})").examples.at(0).desirable);
  const KtoRecord r = render_kto(tok(), format(), how, R"({"prompt": "Q:", "completion": " a", "label": 0})");
  EXPECT_FALSE(r.examples.at(0).desirable);
  EXPECT_EQ(r.examples.at(0).sample.ids, tok().encode_with_special_tokens("Q: a<|eot_id|>"));
  const auto& trained = r.examples.at(0).sample.trained;
  EXPECT_EQ(std::count(trained.begin(), trained.end(), kUndesirable),
            static_cast<long>(trained.size() - tok().encode_with_special_tokens("Q:").size()));
}
