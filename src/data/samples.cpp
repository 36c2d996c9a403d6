#include "data/samples.h"

#include <nlohmann/json.hpp>
#include <numeric>

#include "common/error.h"
#include "common/fs_util.h"
#include "data/parquet.h"
#include "data/tokenizer.h"

namespace ptrain {

using nlohmann::json;

namespace {

const std::string& string_field(const json& j, const char* key) {
  const json& v = j.at(key);
  if (!v.is_string()) throw RuntimeError(std::string("\"") + key + "\" must be a string");
  return v.get_ref<const std::string&>();
}

std::vector<ChatMessage> messages_of(const json& j) {
  const json& list = j.at("messages");
  if (!list.is_array() || list.empty())
    throw RuntimeError("\"messages\" must be a non-empty array of {\"role\", \"content\"}");
  std::vector<ChatMessage> out;
  for (const json& m : list) {
    if (!m.is_object() || !m.contains("role") || !m.contains("content"))
      throw RuntimeError("each message needs \"role\" and \"content\"");
    out.push_back({string_field(m, "role"), string_field(m, "content")});
  }
  return out;
}

// ShareGPT's {"from", "value"} turns; "human" / "gpt" are user / assistant.
std::vector<ChatMessage> sharegpt_of(const json& j) {
  const json& list = j.at("conversations");
  if (!list.is_array() || list.empty())
    throw RuntimeError("\"conversations\" must be a non-empty array of {\"from\", \"value\"}");
  std::vector<ChatMessage> out;
  for (const json& m : list) {
    if (!m.is_object() || !m.contains("from") || !m.contains("value"))
      throw RuntimeError("each turn of \"conversations\" needs \"from\" and \"value\"");
    std::string role = string_field(m, "from");
    if (role == "human") role = "user";
    if (role == "gpt") role = "assistant";
    out.push_back({role, string_field(m, "value")});
  }
  return out;
}

// Alpaca's instruction / input / output (and an optional system) as a conversation.
std::vector<ChatMessage> alpaca_of(const json& j) {
  if (!j.contains("output"))
    throw RuntimeError("an Alpaca record needs \"instruction\" and \"output\" (\"input\" is optional)");
  std::vector<ChatMessage> out;
  if (j.contains("system") && !string_field(j, "system").empty()) out.push_back({"system", string_field(j, "system")});
  std::string user = string_field(j, "instruction");
  if (j.contains("input") && !string_field(j, "input").empty()) user += "\n\n" + string_field(j, "input");
  out.push_back({"user", user});
  out.push_back({"assistant", string_field(j, "output")});
  return out;
}

}  // namespace

const std::vector<std::string>& record_fields() {
  static const std::vector<std::string> f{"text",   "messages", "role",        "content", "conversations",
                                          "from",   "value",    "instruction", "input",   "output",
                                          "system", "prompt",   "completion"};
  return f;
}

namespace {
// Renames a dataset's own field names to the canonical ones, in the record and in its turns.
void canonical_names(json& j, const FieldNames& fields) {
  if (fields.empty() || !j.is_object()) return;
  auto rename = [&](json& o) {
    for (const auto& [canonical, theirs] : fields)
      if (o.is_object() && o.contains(theirs) && !o.contains(canonical)) {
        o[canonical] = std::move(o[theirs]);
        o.erase(theirs);
      }
  };
  rename(j);
  for (const char* list : {"messages", "conversations"})
    if (j.contains(list) && j[list].is_array())
      for (auto& turn : j[list]) rename(turn);
}
}  // namespace

Sample render_record(const Tokenizer& tok, const ChatFormat& format, const std::string& line, bool train_on_prompt,
                     SampleStats& stats, const FieldNames& fields) {
  json j;
  try {
    j = json::parse(line);
  } catch (const json::exception& e) {
    throw RuntimeError(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw RuntimeError("a record must be a JSON object");
  canonical_names(j, fields);
  const auto chat = [&](const std::vector<ChatMessage>& messages) {
    Sample s = render_chat(tok, format, messages, train_on_prompt);
    ++stats.chat;  // counted once rendered: a record skipped as bad is counted there
    return s;
  };
  if (j.contains("messages")) return chat(messages_of(j));
  if (j.contains("conversations")) return chat(sharegpt_of(j));
  if (j.contains("instruction")) return chat(alpaca_of(j));
  if (j.contains("prompt") || j.contains("completion")) {
    if (!j.contains("prompt") || !j.contains("completion"))
      throw RuntimeError("a prompt/completion record needs both \"prompt\" and \"completion\"");
    Sample s = render_document(tok, format, {{string_field(j, "prompt"), false}, {string_field(j, "completion"), true}},
                               train_on_prompt);
    ++stats.prompt_completion;
    return s;
  }
  if (j.contains("text")) {
    Sample s = render_document(tok, format, {{string_field(j, "text"), true}}, true);
    ++stats.text;
    return s;
  }
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  throw RuntimeError(
      "a record needs \"text\", \"messages\", \"conversations\" (ShareGPT), \"instruction\" and \"output\" "
      "(Alpaca), or \"prompt\" and \"completion\" (it has: " +
      (keys.empty() ? std::string("nothing") : keys) + ")");
}

bool SampleSet::add(const Sample& s, int64_t line) {
  int64_t trained = 0;
  for (size_t t = 1; t < s.ids.size(); ++t) trained += s.trained[t] ? 1 : 0;
  if (trained == 0) {
    ++stats.dropped_untrained;
    return false;
  }
  ids_.insert(ids_.end(), s.ids.begin(), s.ids.end());
  trained_.insert(trained_.end(), s.trained.begin(), s.trained.end());
  offsets_.push_back(static_cast<int64_t>(ids_.size()));
  lines_.push_back(line);
  total_trained_ += trained;
  for (int32_t id : s.ids) max_id_ = std::max(max_id_, id);
  return true;
}

SampleSet SampleSet::from_jsonl(const std::string& path, const Tokenizer& tok, const ChatFormat& format,
                                const SampleOptions& o,
                                const std::function<void(int64_t, int64_t, int64_t)>& progress) {
  const std::string data = read_text_file(path);
  std::vector<std::string> records;
  std::vector<int64_t> lines, ends;  // each record's line and the byte after it
  size_t pos = 0;
  int64_t line = 0;
  while (pos < data.size()) {
    size_t end = data.find('\n', pos);
    end = end == std::string::npos ? data.size() : end + 1;
    ++line;
    std::string record = data.substr(pos, end - pos);
    pos = end;
    if (record.find_first_not_of(" \t\r\n") == std::string::npos) continue;
    records.push_back(std::move(record));
    lines.push_back(line);
    ends.push_back(static_cast<int64_t>(pos));
  }
  return from_records(path, records, lines, ends, static_cast<int64_t>(data.size()), ":", tok, format, o, progress);
}

SampleSet SampleSet::from_parquet(const std::string& path, const Tokenizer& tok, const ChatFormat& format,
                                  const SampleOptions& o,
                                  const std::function<void(int64_t, int64_t, int64_t)>& progress) {
  const std::vector<std::string> records = parquet_records(path);
  std::vector<int64_t> rows(records.size());
  std::iota(rows.begin(), rows.end(), int64_t{1});
  return from_records(path, records, rows, rows, static_cast<int64_t>(records.size()), ": row ", tok, format, o,
                      progress);
}

SampleSet SampleSet::from_records(const std::string& path, const std::vector<std::string>& records,
                                  const std::vector<int64_t>& where, const std::vector<int64_t>& done, int64_t total,
                                  const std::string& separator, const Tokenizer& tok, const ChatFormat& format,
                                  const SampleOptions& o,
                                  const std::function<void(int64_t, int64_t, int64_t)>& progress) {
  SampleSet set;
  set.source_ = path;
  for (size_t r = 0; r < records.size(); ++r) {
    ++set.stats.records;
    Sample s;
    try {
      s = render_record(tok, format, records[r], o.train_on_prompt, set.stats, o.fields);
    } catch (const std::exception& e) {
      const std::string why = path + separator + std::to_string(where[r]) + ": " + e.what();
      if (!o.skip_bad_records) throw RuntimeError(why);
      if (set.stats.skipped_bad++ == 0) set.stats.first_bad = why;
      continue;
    }
    if (o.max_ids > 0 && static_cast<int64_t>(s.ids.size()) > o.max_ids) {
      if (o.drop_too_long) {
        ++set.stats.dropped_too_long;
        continue;
      }
      ++set.stats.truncated;
      s.ids.resize(o.max_ids);
      s.trained.resize(o.max_ids);
    }
    set.add(s, where[r]);
    if (progress && (set.stats.records % 1000 == 0)) progress(done[r], total, set.total_ids());
  }
  if (progress) progress(total, total, set.total_ids());
  return set;
}

}  // namespace ptrain
