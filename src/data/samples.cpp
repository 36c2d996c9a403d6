#include "data/samples.h"

#include <algorithm>
#include <array>
#include <exception>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <thread>

#include "common/error.h"
#include "common/fs_util.h"
#include "common/python_json.h"
#include "data/json_array.h"
#include "data/parquet.h"
#include "data/rows.h"
#include "data/sample_writer.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

// Records keep their keys' order: a chat's tools and tool arguments render as written (python_json).
using ojson = nlohmann::ordered_json;

namespace {

const std::string& string_field(const ojson& j, const char* key) {
  const ojson& v = j.at(key);
  if (!v.is_string()) throw RuntimeError(std::string("\"") + key + "\" must be a string");
  return v.get_ref<const std::string&>();
}

// What a record kind reads is all it holds: any other field — a turn's "weight" or
// "tool_calls", a "system" beside ShareGPT turns, a second record kind, an "id" — would be left
// out of the sample without a word, so it is refused by name (data.ignore_fields leaves fields
// out knowingly: they are gone before this is asked). (A message's "reasoning_content" is read;
// templates other than Qwen3's refuse it when they render.) `what` names the object, with its
// 1-based `number` among its kind where it has one (a message, a turn): the label is built only
// for a refusal, as every turn of every record is asked.
void only_fields(const ojson& o, std::initializer_list<const char*> read, const char* what, size_t number = 0) {
  for (auto it = o.begin(); it != o.end(); ++it) {
    bool known = false;
    for (const char* r : read) known = known || it.key() == r;
    if (known) continue;
    std::string reads;
    for (const char* r : read) reads += std::string(reads.empty() ? "" : ", ") + "\"" + r + "\"";
    const std::string hint =
        it.key() == "system" ? " (put it in the chat as its first turn, with the role \"system\")" : "";
    throw RuntimeError(std::string(what) + (number ? " " + std::to_string(number) : "") + " holds \"" + it.key() +
                       "\", which ptrain does not read (it reads " + reads + ")" + hint +
                       ": remove it, or list it in data.ignore_fields to leave it out knowingly");
  }
}

// Refuses JSON text holding an integer wider than 64 bits: its numbers render (python_json), and
// Python keeps such an integer exact where a parse here turns it into a float.
void refuse_wide_integers(const std::string& json_text) {
  const std::string wide = wide_json_integer(json_text);
  if (!wide.empty())
    throw RuntimeError("the integer " + wide.substr(0, 40) +
                       " is too large for 64 bits, and ptrain cannot render it as transformers does (as "
                       "written): write it as a string");
}

// A chat's "tools" (null or a list of tool definitions, each an object) as the template's
// `tojson` renders each; or a string holding that JSON, which TRL's SFTTrainer decodes
// (json.loads) before rendering — datasets such as xlam-function-calling store their tools so.
ChatTools tools_of(const ojson& j) {
  if (!j.contains("tools") || j.at("tools").is_null()) return std::nullopt;
  std::vector<std::string> out;
  ojson decoded;
  if (j.at("tools").is_string()) {
    const std::string& text = j.at("tools").get_ref<const std::string&>();
    try {
      decoded = ojson::parse(text);
    } catch (const ojson::parse_error& e) {
      throw RuntimeError(std::string("\"tools\" is a string that does not hold JSON (a string is decoded as TRL "
                                     "decodes it, with json.loads): ") +
                         e.what());
    }
    refuse_wide_integers(text);
    if (decoded.is_null()) return std::nullopt;
  }
  const ojson& tools = j.at("tools").is_string() ? decoded : j.at("tools");
  if (!tools.is_array())
    throw RuntimeError("\"tools\" must be a list of tool definitions (JSON objects), or a string holding one");
  for (const ojson& t : tools) {
    if (!t.is_object()) throw RuntimeError("each of \"tools\" must be a tool definition (a JSON object)");
    out.push_back(python_json(t));
  }
  return out;
}

// A reply's "tool_calls" (null or a list) as the released Qwen2.5, Qwen3, Llama 3.1 and Mistral
// Nemo templates read each: the call's "function" where it has one (Llama 3.1's and Nemo's read
// only that form; Nemo's renders it whole), its "name" (a string) and "arguments" (an object, or a
// string: Qwen2.5's and Llama 3.1's `tojson` quote it, Qwen3's renders it as given), its "id"
// (Nemo's renders it). A call's "type", which no template renders, is read and left out.
std::vector<ToolCall> tool_calls_of(const ojson& m, size_t number) {
  std::vector<ToolCall> out;
  const ojson& calls = m.at("tool_calls");
  if (calls.is_null()) return out;
  const std::string where = "message " + std::to_string(number) + "'s tool call ";
  if (!calls.is_array()) throw RuntimeError("message " + std::to_string(number) + "'s \"tool_calls\" must be a list");
  for (const ojson& call : calls) {
    const std::string at = where + std::to_string(out.size() + 1);
    if (!call.is_object()) throw RuntimeError(at + " must be a JSON object");
    const bool wrapped = call.contains("function");
    only_fields(call,
                wrapped ? std::initializer_list<const char*>{"function", "id", "type"}
                        : std::initializer_list<const char*>{"name", "arguments", "id", "type"},
                at.c_str());
    const ojson& f = wrapped ? call.at("function") : call;
    if (!f.is_object()) throw RuntimeError(at + "'s \"function\" must be a JSON object");
    if (wrapped) only_fields(f, {"name", "arguments"}, (at + "'s function").c_str());
    if (!f.contains("name") || !f.at("name").is_string() || !f.contains("arguments"))
      throw RuntimeError(at + " needs \"name\" (a string) and \"arguments\"");
    if (!f.at("arguments").is_object() && !f.at("arguments").is_string())
      throw RuntimeError(at + "'s \"arguments\" must be a JSON object (or a string holding one)");
    ToolCall& c = out.emplace_back();
    c.name = f.at("name").get<std::string>();
    c.arguments = python_json(f.at("arguments"));
    if (f.at("arguments").is_string()) c.text = f.at("arguments").get<std::string>();
    c.in_function = wrapped;
    if (wrapped) c.function_json = python_json(f);
    if (call.contains("id") && call.at("id").is_string()) c.id = call.at("id").get<std::string>();
  }
  return out;
}

struct Chat {
  std::vector<ChatMessage> messages;
  ChatTools tools;
};

Chat messages_of(const ojson& j) {
  only_fields(j, {"messages", "tools"}, "a \"messages\" record");
  return {chat_turns(j.at("messages")), tools_of(j)};
}

}  // namespace

ChatTools chat_tools(const ojson& record, const std::string& line) {
  ChatTools tools = tools_of(record);
  if (tools && !tools->empty()) refuse_wide_integers(line);
  return tools;
}

std::vector<ChatMessage> chat_turns(const ojson& list) {
  if (!list.is_array() || list.empty())
    throw RuntimeError("\"messages\" must be a non-empty array of {\"role\", \"content\"}");
  std::vector<ChatMessage> out;
  for (const ojson& given : list) {
    const size_t number = out.size() + 1;
    // A field that is null holds nothing: absent, as for the templates (a Parquet column of turns
    // has every field of every turn, null where a turn lacks it) — but a null content, which is read.
    const auto absent = [](const auto& field) { return field.value().is_null() && field.key() != "content"; };
    ojson cleaned;
    const bool nulls = given.is_object() && std::any_of(given.items().begin(), given.items().end(), absent);
    if (nulls) {
      cleaned = given;
      for (auto it = cleaned.begin(); it != cleaned.end();) it = absent(it) ? cleaned.erase(it) : std::next(it);
    }
    const ojson& m = nulls ? cleaned : given;
    if (m.is_object() && m.contains("tool_calls") && !m.at("tool_calls").is_null() && !m.at("tool_calls").is_array())
      throw RuntimeError("message " + std::to_string(number) + "'s \"tool_calls\" must be a list");
    const bool calls =
        m.is_object() && m.contains("tool_calls") && m.at("tool_calls").is_array() && !m.at("tool_calls").empty();
    // a reply that calls tools may have no content (null, or none at all)
    if (!m.is_object() || !m.contains("role") || (!m.contains("content") && !calls))
      throw RuntimeError("each message needs \"role\" and \"content\"");
    const std::string& role = string_field(m, "role");
    if (role == "tool")  // a tool's result: the call's id and the tool's name are not rendered
      only_fields(m, {"role", "content", "tool_call_id", "name"}, "message", number);
    else
      only_fields(m, {"role", "content", "reasoning_content", "tool_calls"}, "message", number);
    const bool no_content = !m.contains("content") || m.at("content").is_null();
    out.push_back({role, calls && no_content ? std::string() : string_field(m, "content"), std::nullopt});
    out.back().content_null = calls && no_content;
    if (m.contains("reasoning_content")) out.back().reasoning = string_field(m, "reasoning_content");
    if (role == "tool" && m.contains("tool_call_id") && m.at("tool_call_id").is_string())
      out.back().tool_call_id = m.at("tool_call_id").get<std::string>();
    if (m.contains("tool_calls")) {
      if (role != "assistant")
        throw RuntimeError("message " + std::to_string(number) + " holds \"tool_calls\", which only a reply may");
      out.back().tool_calls = tool_calls_of(m, number);
      out.back().tool_calls_listed = true;
    }
  }
  return out;
}

namespace {

// ShareGPT's {"from", "value"} turns; "human" / "gpt" are user / assistant.
std::vector<ChatMessage> sharegpt_of(const ojson& j) {
  const ojson& list = j.at("conversations");
  if (!list.is_array() || list.empty())
    throw RuntimeError("\"conversations\" must be a non-empty array of {\"from\", \"value\"}");
  only_fields(j, {"conversations"}, "a \"conversations\" record");
  std::vector<ChatMessage> out;
  for (const ojson& m : list) {
    if (!m.is_object() || !m.contains("from") || !m.contains("value"))
      throw RuntimeError("each turn of \"conversations\" needs \"from\" and \"value\"");
    only_fields(m, {"from", "value"}, "turn", out.size() + 1);
    std::string role = string_field(m, "from");
    if (role == "human") role = "user";
    if (role == "gpt") role = "assistant";
    out.push_back({role, string_field(m, "value")});
  }
  return out;
}

// Alpaca's instruction / input / output (and an optional system) as a conversation; "history"
// (as LLaMA-Factory writes it: [[instruction, output], ...]) is the turns before it.
std::vector<ChatMessage> alpaca_of(const ojson& j) {
  if (!j.contains("output"))
    throw RuntimeError("an Alpaca record needs \"instruction\" and \"output\" (\"input\" is optional)");
  only_fields(j, {"instruction", "input", "output", "system", "history"}, "an Alpaca record");
  std::vector<ChatMessage> out;
  if (j.contains("system") && !string_field(j, "system").empty()) out.push_back({"system", string_field(j, "system")});
  if (j.contains("history")) {
    const ojson& history = j.at("history");
    if (!history.is_array()) throw RuntimeError("\"history\" must be a list of [instruction, output] pairs");
    for (const ojson& turn : history) {
      if (!turn.is_array() || turn.size() != 2 || !turn[0].is_string() || !turn[1].is_string())
        throw RuntimeError("each turn of \"history\" must be [instruction, output], two strings");
      out.push_back({"user", turn[0].get<std::string>()});
      out.push_back({"assistant", turn[1].get<std::string>()});
    }
  }
  std::string user = string_field(j, "instruction");
  if (j.contains("input") && !string_field(j, "input").empty()) user += "\n\n" + string_field(j, "input");
  out.push_back({"user", user});
  out.push_back({"assistant", string_field(j, "output")});
  return out;
}

}  // namespace

const std::vector<std::string>& record_fields() {
  static const std::vector<std::string> f{"text",   "messages", "role",        "content",   "conversations",
                                          "from",   "value",    "instruction", "input",     "output",
                                          "system", "history",  "prompt",      "completion"};
  return f;
}

namespace {
// Leaves out the fields data.ignore_fields names, in the record and in its turns.
void drop_ignored(ojson& j, const std::vector<std::string>& ignored) {
  if (ignored.empty() || !j.is_object()) return;
  for (const auto& f : ignored) j.erase(f);
  for (auto& [key, list] : j.items())
    if (list.is_array())
      for (auto& turn : list)
        if (turn.is_object())
          for (const auto& f : ignored) turn.erase(f);
}

// Renames a dataset's own field names to the canonical ones, in the record and in its turns.
void canonical_names(ojson& j, const FieldNames& fields) {
  if (fields.empty() || !j.is_object()) return;
  auto rename = [&](ojson& o) {
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
// The record's fields, "a, b" ("nothing" when it has none).
std::string field_list(const ojson& j) {
  std::string keys;
  for (auto it = j.begin(); it != j.end(); ++it) keys += (keys.empty() ? "" : ", ") + it.key();
  return keys.empty() ? "nothing" : keys;
}

// One line as a record object: its fields renamed to the canonical ones, the ignored ones gone.
ojson parsed_record(const std::string& line, const FieldNames& fields, const std::vector<std::string>& ignore_fields) {
  ojson j;
  try {
    j = ojson::parse(line);
  } catch (const ojson::exception& e) {
    throw RuntimeError(std::string("not valid JSON (") + e.what() + ")");
  }
  if (!j.is_object()) throw RuntimeError("a record must be a JSON object");
  drop_ignored(j, ignore_fields);
  canonical_names(j, fields);
  return j;
}
}  // namespace

namespace {
size_t common_prefix(const std::vector<int32_t>& a, const std::vector<int32_t>& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  return n;
}

// A text record or completion ending with the eos_token, as TRL's trainers add it (unless it ends
// with it).
std::string with_eos(std::string completion, const std::string& eos) {
  if (eos.empty())
    throw NoEosToken(
        "a text record (or text completion) ends with the tokenizer's eos_token, as TRL's trainers add it, and "
        "this tokenizer names none: point data.tokenizer at the model directory (its tokenizer_config.json names "
        "eos_token)");
  const bool ends =
      completion.size() >= eos.size() && completion.compare(completion.size() - eos.size(), eos.size(), eos) == 0;
  return ends ? completion : completion + eos;
}

// A conversational prompt/completion record ({"prompt": [turns], "completion": [turns], "tools"?})
// as TRL's SFTTrainer tokenizes it: the prompt with the generation prompt, the whole chat, and a loss
// on every token after their common prefix (its completion_mask; all of them with train_on_prompt);
// counted in `stats` as a chat.
Sample completion_chat(const Tokenizer& tok, const ChatFormat& format, const ojson& j, const std::string& line,
                       bool train_on_prompt, SampleStats& stats) {
  only_fields(j, {"prompt", "completion", "tools"}, "a conversational prompt/completion record");
  if (!j.at("prompt").is_array() || !j.at("completion").is_array())
    throw RuntimeError(
        "\"prompt\" and \"completion\" must both be message lists (a conversational record) or both "
        "strings");
  const ChatTools tools = chat_tools(j, line);
  const std::vector<ChatMessage> prompt = chat_turns(j.at("prompt"));
  std::vector<ChatMessage> all = prompt;
  for (ChatMessage& m : chat_turns(j.at("completion"))) all.push_back(std::move(m));
  if (std::any_of(all.begin(), all.end(), [](const ChatMessage& m) { return !m.tool_calls.empty(); }))
    refuse_wide_integers(line);
  const std::vector<int32_t> prompt_ids = render_prompt(tok, format, prompt, tools);
  Sample s = render_chat(tok, format, all, /*train_on_prompt=*/true, tools);
  const auto n = static_cast<std::ptrdiff_t>(common_prefix(prompt_ids, s.ids));
  std::fill(s.trained.begin(), s.trained.begin() + n, train_on_prompt ? 1 : 0);
  std::fill(s.trained.begin() + n, s.trained.end(), 1);
  ++stats.chat;
  stats.call_text_dropped += replies_losing_call_text(format, all);
  stats.reasoning_dropped += replies_losing_reasoning(format, all);
  return s;
}

// A text prompt/completion record as TRL's SFTTrainer tokenizes it: HF's tokenizer(prompt) and
// tokenizer(prompt + completion + eos_token), the loss on every token after their common prefix
// (all of them with train_on_prompt); a prompt that is no prefix of the whole (a token merging
// across the boundary) is counted in `stats`.
Sample text_completion(const Tokenizer& tok, const std::string& eos, const std::string& prompt,
                       const std::string& completion, bool train_on_prompt, SampleStats& stats) {
  const std::vector<int32_t> prompt_ids = tok.encode_with_special_tokens(prompt);
  Sample s;
  s.ids = tok.encode_with_special_tokens(prompt + with_eos(completion, eos));
  const size_t n = common_prefix(prompt_ids, s.ids);
  s.trained.assign(s.ids.size(), 1);
  std::fill(s.trained.begin(), s.trained.begin() + static_cast<std::ptrdiff_t>(n), train_on_prompt ? 1 : 0);
  stats.prompt_diverged += n < prompt_ids.size() ? 1 : 0;
  return s;
}
}  // namespace

Sample render_record(const Tokenizer& tok, const ChatFormat& format, const TrlTokenization& how,
                     const std::string& line, bool train_on_prompt, SampleStats& stats, const FieldNames& fields,
                     const std::vector<std::string>& ignore_fields) {
  ojson j = parsed_record(line, fields, ignore_fields);
  const auto chat = [&](const std::vector<ChatMessage>& messages, const ChatTools& tools = std::nullopt) {
    Sample s = render_chat(tok, format, messages, train_on_prompt, tools);
    ++stats.chat;  // counted once rendered: a record skipped as bad is counted there
    stats.reasoning_dropped += replies_losing_reasoning(format, messages);
    stats.call_text_dropped += replies_losing_call_text(format, messages);
    return s;
  };
  if (j.contains("messages")) {
    const Chat c = messages_of(j);
    const bool calls =
        std::any_of(c.messages.begin(), c.messages.end(), [](const ChatMessage& m) { return !m.tool_calls.empty(); });
    if ((c.tools && !c.tools->empty()) || calls) refuse_wide_integers(line);
    return chat(c.messages, c.tools);
  }
  if (j.contains("conversations")) return chat(sharegpt_of(j));
  if (j.contains("instruction")) return chat(alpaca_of(j));
  if (j.contains("prompt") || j.contains("completion")) {
    if (!j.contains("prompt") || !j.contains("completion"))
      throw RuntimeError("a prompt/completion record needs both \"prompt\" and \"completion\"");
    if (j.at("prompt").is_array() || j.at("completion").is_array())
      return completion_chat(tok, format, j, line, train_on_prompt, stats);
    only_fields(j, {"prompt", "completion"}, "a prompt/completion record");
    Sample s =
        text_completion(tok, how.eos, string_field(j, "prompt"), string_field(j, "completion"), train_on_prompt, stats);
    ++stats.prompt_completion;
    return s;
  }
  if (j.contains("text")) {
    only_fields(j, {"text"}, "a \"text\" record");
    Sample s;  // as TRL's SFTTrainer: tokenizer(text + eos_token), every token trained
    s.ids = tok.encode_with_special_tokens(with_eos(string_field(j, "text"), how.eos));
    s.trained.assign(s.ids.size(), 1);
    ++stats.text;
    return s;
  }
  const std::string keys = field_list(j);
  throw RuntimeError(
      "a record needs \"text\", \"messages\", \"conversations\" (ShareGPT), \"instruction\" and \"output\" "
      "(Alpaca), or \"prompt\" and \"completion\" (it has: " +
      keys + ")");
}

namespace {

// TRL's extract_prompt on two strings: the index (in bytes, on a character boundary) where
// they first differ, moved back over one space before it; where one is a prefix of the other,
// the shorter one's last character (as its loop leaves its index).
size_t shared_text_prompt(const std::string& a, const std::string& b) {
  size_t n = 0;
  while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
  const auto continuation = [](char c) { return (static_cast<unsigned char>(c) & 0xC0) == 0x80; };
  if (n == a.size() || n == b.size()) {  // no character differs: the loop ran to its last index
    const std::string& shorter = a.size() <= b.size() ? a : b;
    if (shorter.empty()) throw RuntimeError("\"chosen\" or \"rejected\" is empty and there is no \"prompt\"");
    size_t last = shorter.size() - 1;
    while (last > 0 && continuation(shorter[last])) --last;
    return last;
  }
  while (n > 0 && continuation(a[n])) --n;  // back to the start of the differing character
  if (n == 0) {
    // TRL would look at the last character (Python's s[-1]) and cut the text oddly there
    if (a.back() == ' ')
      throw RuntimeError(
          "\"chosen\" and \"rejected\" share no prompt and \"chosen\" ends with a space; give "
          "the record a \"prompt\"");
    return 0;
  }
  return a[n - 1] == ' ' ? n - 1 : n;
}

}  // namespace

namespace {

// TRL's maybe_apply_chat_template on a pair's prompt and completions: the characters the
// prompt's rendering (with the generation prompt) shares with both whole chats, and the rest of
// each (Python's characters: the cut is on a UTF-8 character boundary).
std::array<std::string, 3> chat_pair_text(const ChatFormat& format, const std::vector<ChatMessage>& turns,
                                          const ojson& chosen, const ojson& rejected) {
  const auto whole = [&](const ojson& completion) {
    std::vector<ChatMessage> all = turns;
    for (auto& m : chat_turns(completion)) all.push_back(std::move(m));
    return chat_text(format, all, /*generation_prompt=*/false);
  };
  std::string prompt = chat_text(format, turns, /*generation_prompt=*/true);
  const std::string c = whole(chosen), r = whole(rejected);
  for (const std::string* s : {&c, &r}) {
    size_t n = std::mismatch(prompt.begin(), prompt.end(), s->begin(), s->end()).first - prompt.begin();
    while (n > 0 && n < prompt.size() && (static_cast<unsigned char>(prompt[n]) & 0xC0) == 0x80) --n;
    prompt.resize(n);
  }
  return {prompt, c.substr(prompt.size()), r.substr(prompt.size())};
}

// One side of a pair as TRL's CPOTrainer.build_tokenized_answer tokenizes it: enc(prompt +
// completion) without special tokens, the prompt its first len(enc(prompt)) ids — one fewer
// where those are not enc(prompt) (the prompt's last token merged with the completion's first).
struct CpoSide {
  std::vector<int32_t> ids;
  size_t prompt = 0;
  bool diverged = false;
};
CpoSide cpo_side(const Tokenizer& tok, const std::string& prompt, const std::string& completion) {
  CpoSide s;
  s.ids = tok.encode(prompt + completion);
  const std::vector<int32_t> p = tok.encode(prompt);
  if (p.size() > s.ids.size())
    throw RuntimeError(
        "the prompt alone encodes to more tokens than prompt + completion (TRL's CPOTrainer refuses it)");
  s.diverged = !std::equal(p.begin(), p.end(), s.ids.begin());
  s.prompt = p.size() - (s.diverged ? 1 : 0);
  return s;
}

// TRL's CPOTrainer.tokenize_row on a pair of texts (build_tokenized_answer, then the bos_token
// before a prompt that does not start with it and the eos_token after a completion that does
// not end with it).
PreferencePair cpo_pair(const Tokenizer& tok, const TrlTokenization& how, const std::string& prompt,
                        const std::string& chosen, const std::string& rejected) {
  const std::optional<int32_t> eos = how.eos.empty() ? std::nullopt : tok.id_of(how.eos);
  if (!eos)
    throw RuntimeError(
        "SimPO and CPO pairs end each completion with the tokenizer's eos_token (as TRL's CPOTrainer does), and this "
        "tokenizer names " +
        (how.eos.empty() ? std::string("none: point data.tokenizer at the model directory (its tokenizer_config.json)")
                         : "\"" + how.eos + "\", which is not one of its tokens"));
  std::optional<int32_t> bos;
  if (!how.bos.empty() && !(bos = tok.id_of(how.bos)))
    throw RuntimeError("the tokenizer's bos_token \"" + how.bos + "\" is not one of its tokens");
  CpoSide c = cpo_side(tok, prompt, chosen), r = cpo_side(tok, prompt, rejected);
  size_t differ = c.prompt > r.prompt ? c.prompt - r.prompt : r.prompt - c.prompt;
  for (size_t i = 0; i < std::min(c.prompt, r.prompt); ++i) differ += c.ids[i] != r.ids[i] ? 1 : 0;
  if (differ > 1)
    throw RuntimeError(
        "\"chosen\" and \"rejected\" tokenize the prompt differently beyond its last token (TRL's CPOTrainer "
        "refuses such a pair)");
  PreferencePair out;
  out.prompt_diverged = c.diverged || r.diverged;
  for (auto [side, sample] : {std::pair{&c, &out.chosen}, std::pair{&r, &out.rejected}}) {
    if (bos && (side->prompt == 0 || side->ids[0] != *bos)) {
      side->ids.insert(side->ids.begin(), *bos);
      ++side->prompt;
    }
    if (side->ids.size() == side->prompt || side->ids.back() != *eos) side->ids.push_back(*eos);
    sample->trained.assign(side->ids.size(), 0);
    std::fill(sample->trained.begin() + static_cast<std::ptrdiff_t>(side->prompt), sample->trained.end(), 1);
    sample->ids = std::move(side->ids);
    out.prompt_ids = std::max(out.prompt_ids, static_cast<int64_t>(side->prompt));
  }
  return out;
}

}  // namespace

namespace {
// A pair without "prompt": the prompt is what chosen and rejected share (TRL's extract_prompt) —
// their leading turns that are equal, or the text prompt shared_text_prompt cuts.
void split_shared_prompt(bool conversational, ojson& prompt, ojson& chosen, ojson& rejected) {
  if (conversational) {
    size_t idx = 0;
    const size_t n = std::min(chosen.size(), rejected.size());
    if (n == 0) throw RuntimeError("\"chosen\" or \"rejected\" is empty and there is no \"prompt\"");
    // equal as Python's dicts are: whatever the order of their keys
    const auto same = [](const ojson& a, const ojson& b) {
      return nlohmann::json::parse(a.dump()) == nlohmann::json::parse(b.dump());
    };
    while (idx < n && same(chosen[idx], rejected[idx])) ++idx;
    if (idx == n) idx = n - 1;  // as TRL's loop leaves its index
    prompt = ojson(std::vector<ojson>(chosen.begin(), chosen.begin() + static_cast<std::ptrdiff_t>(idx)));
    chosen = ojson(std::vector<ojson>(chosen.begin() + static_cast<std::ptrdiff_t>(idx), chosen.end()));
    rejected = ojson(std::vector<ojson>(rejected.begin() + static_cast<std::ptrdiff_t>(idx), rejected.end()));
    return;
  }
  const std::string c = chosen.get<std::string>(), r = rejected.get<std::string>();
  const size_t cut = shared_text_prompt(c, r);
  prompt = c.substr(0, cut);
  chosen = c.substr(cut);
  rejected = r.substr(cut);
}

// Whether a conversational record's parts hold a tool call or a tool result.
bool holds_tool_calls(bool conversational, std::initializer_list<const ojson*> parts) {
  bool calls = false;
  for (const ojson* part : parts)
    for (const ChatMessage& m : conversational && !part->empty() ? chat_turns(*part) : std::vector<ChatMessage>{})
      calls = calls || m.role == "tool" || !m.tool_calls.empty();
  return calls;
}

}  // namespace

PreferencePair render_preference(const Tokenizer& tok, const ChatFormat& format, const TrlTokenization& how,
                                 const std::string& line, const FieldNames& fields,
                                 const std::vector<std::string>& ignore_fields) {
  ojson j = parsed_record(line, fields, ignore_fields);
  if (!j.contains("chosen") || !j.contains("rejected")) {
    const std::string keys = field_list(j);
    throw RuntimeError(
        "a preference record needs \"chosen\" and \"rejected\" (and \"prompt\", or a prompt they "
        "share) (it has: " +
        keys + ")");
  }
  only_fields(j, {"prompt", "chosen", "rejected", "tools"}, "a preference record");
  ojson prompt = j.contains("prompt") ? j.at("prompt") : ojson();
  ojson chosen = j.at("chosen"), rejected = j.at("rejected");
  const bool conversational = chosen.is_array();
  for (const auto* part : {&prompt, &chosen, &rejected}) {
    if (part->is_null() && part == &prompt) continue;
    if (conversational ? !part->is_array() : !part->is_string())
      throw RuntimeError("\"prompt\", \"chosen\" and \"rejected\" must all be strings or all message lists");
  }
  if (prompt.is_null()) split_shared_prompt(conversational, prompt, chosen, rejected);
  const std::vector<ChatMessage> turns =
      conversational && !prompt.empty() ? chat_turns(prompt) : std::vector<ChatMessage>{};
  // A pair's tools and tool calls render as TRL's DPOTrainer renders them (the record's "tools" passed
  // to the template, a string decoded); its CPOTrainer and ORPOTrainer pass no tools, and ptrain has
  // not compared their pairs with tool calls: refused there.
  const bool tools_given = j.contains("tools") && !j.at("tools").is_null();
  if (tools_given && !conversational)
    throw RuntimeError("\"tools\" go with a conversational pair (message lists), whose template renders them");
  const bool calls = holds_tool_calls(conversational, {&prompt, &chosen, &rejected});
  if (how.cpo && (tools_given || calls))
    throw RuntimeError(std::string(tools_given ? "\"tools\"" : "tool calls or tool results") +
                       " in a CPO / SimPO / ORPO pair: TRL's CPOTrainer and ORPOTrainer render a pair without the "
                       "record's tools, and ptrain renders tools, tool calls and results in DPO pairs only (as "
                       "TRL's DPOTrainer does)" +
                       (tools_given ? "; list \"tools\" in data.ignore_fields to train without them knowingly" : ""));
  const ChatTools tools = conversational ? chat_tools(j, line) : std::nullopt;
  if (calls) refuse_wide_integers(line);
  if (how.cpo) {
    PreferencePair out;
    if (conversational) {
      const auto [p, c, r] = chat_pair_text(format, turns, chosen, rejected);
      out = cpo_pair(tok, how, p, c, r);
    } else {
      out = cpo_pair(tok, how, prompt.get<std::string>(), chosen.get<std::string>(), rejected.get<std::string>());
    }
    out.conversational = conversational;
    return out;
  }
  PreferencePair out;
  out.conversational = conversational;
  std::vector<int32_t> prompt_ids, with_chosen, with_rejected;
  if (conversational) {
    prompt_ids = render_prompt(tok, format, turns, tools);
    auto whole = [&](const ojson& completion) {
      std::vector<ChatMessage> all = turns;
      for (auto& m : chat_turns(completion)) all.push_back(std::move(m));
      return render_chat(tok, format, all, /*train_on_prompt=*/true, tools).ids;
    };
    with_chosen = whole(chosen);
    with_rejected = whole(rejected);
  } else {
    const std::string p = prompt.get<std::string>();
    const std::string c = with_eos(chosen.get<std::string>(), how.eos),
                      r = with_eos(rejected.get<std::string>(), how.eos);
    prompt_ids = tok.encode_with_special_tokens(p);
    with_chosen = tok.encode_with_special_tokens(p + c);
    with_rejected = tok.encode_with_special_tokens(p + r);
  }
  const size_t n = std::min(common_prefix(prompt_ids, with_chosen), common_prefix(prompt_ids, with_rejected));
  out.prompt_ids = static_cast<int64_t>(n);
  out.prompt_diverged = n < prompt_ids.size();
  auto sample = [n](std::vector<int32_t>&& ids) {
    Sample s;
    s.trained.assign(ids.size(), 0);
    std::fill(s.trained.begin() + static_cast<std::ptrdiff_t>(n), s.trained.end(), 1);
    s.ids = std::move(ids);
    return s;
  };
  out.chosen = sample(std::move(with_chosen));
  out.rejected = sample(std::move(with_rejected));
  return out;
}

KtoRecord render_kto(const Tokenizer& tok, const ChatFormat& format, const TrlTokenization& how,
                     const std::string& line, const FieldNames& fields, const std::vector<std::string>& ignore_fields) {
  ojson j = parsed_record(line, fields, ignore_fields);
  KtoRecord out;
  out.paired = j.contains("chosen") || j.contains("rejected");
  std::vector<std::pair<ojson, bool>> completions;  // each completion and whether it is desirable
  ojson prompt = j.contains("prompt") ? j.at("prompt") : ojson();
  if (out.paired) {
    if (!j.contains("chosen") || !j.contains("rejected"))
      throw RuntimeError("a paired KTO record needs both \"chosen\" and \"rejected\" (it has: " + field_list(j) + ")");
    only_fields(j, {"prompt", "chosen", "rejected", "tools"}, "a paired KTO record");
    completions = {{j.at("chosen"), true}, {j.at("rejected"), false}};
  } else {
    if (!j.contains("prompt") || !j.contains("completion") || !j.contains("label"))
      throw RuntimeError(
          "a KTO record needs \"prompt\", \"completion\" and \"label\" (true: desirable), or \"chosen\" and "
          "\"rejected\" (it has: " +
          field_list(j) + ")");
    only_fields(j, {"prompt", "completion", "label", "tools"}, "a KTO record");
    const ojson& label = j.at("label");
    // TRL reads the label as torch.as_tensor(labels, dtype=torch.bool): true / false, or 1 / 0
    const bool is_bit = label.is_number_integer() && (label.get<int64_t>() == 0 || label.get<int64_t>() == 1);
    if (!label.is_boolean() && !is_bit)
      throw RuntimeError("\"label\" must be true (a desirable completion) or false, got " + label.dump());
    completions = {{j.at("completion"), label.is_boolean() ? label.get<bool>() : label.get<int64_t>() == 1}};
  }
  out.conversational = completions[0].first.is_array();
  for (const ojson* part : {&prompt, &completions[0].first, &completions.back().first}) {
    if (part->is_null() && part == &prompt) continue;
    if (out.conversational ? !part->is_array() : !part->is_string())
      throw RuntimeError(out.paired ? "\"prompt\", \"chosen\" and \"rejected\" must all be strings or all message lists"
                                    : "\"prompt\" and \"completion\" must both be strings or both message lists");
  }
  if (prompt.is_null()) split_shared_prompt(out.conversational, prompt, completions[0].first, completions[1].first);
  const bool tools_given = j.contains("tools") && !j.at("tools").is_null();
  if (tools_given && !out.conversational)
    throw RuntimeError("\"tools\" go with a conversational record (message lists), whose template renders them");
  if (holds_tool_calls(out.conversational, {&prompt, &completions[0].first, &completions.back().first}))
    refuse_wide_integers(line);
  const ChatTools tools = out.conversational ? chat_tools(j, line) : std::nullopt;
  const std::vector<ChatMessage> turns =
      out.conversational && !prompt.empty() ? chat_turns(prompt) : std::vector<ChatMessage>{};
  // KTOTrainer's tokenize_fn: the prompt (with the generation prompt), the prompt and completion
  // whole (text: the completion ending with eos_token), each completion on its own
  const std::vector<int32_t> prompt_ids = out.conversational
                                              ? render_prompt(tok, format, turns, tools)
                                              : tok.encode_with_special_tokens(prompt.get<std::string>());
  for (const auto& [completion, desirable] : completions) {
    std::vector<int32_t> ids;
    if (out.conversational) {
      std::vector<ChatMessage> all = turns;
      for (auto& m : chat_turns(completion)) all.push_back(std::move(m));
      ids = render_chat(tok, format, all, /*train_on_prompt=*/true, tools).ids;
    } else {
      ids =
          tok.encode_with_special_tokens(prompt.get<std::string>() + with_eos(completion.get<std::string>(), how.eos));
    }
    const size_t n = common_prefix(prompt_ids, ids);
    KtoExample e;
    e.desirable = desirable;
    e.prompt_diverged = n < prompt_ids.size();
    e.sample.trained.assign(ids.size(), 0);
    std::fill(e.sample.trained.begin() + static_cast<std::ptrdiff_t>(n), e.sample.trained.end(),
              desirable ? kDesirable : kUndesirable);
    e.sample.ids = std::move(ids);
    out.examples.push_back(std::move(e));
  }
  return out;
}

namespace {

void append_sample(const Sample& s, int64_t line, SampleBlock& out) {
  int64_t trained = 0;
  for (size_t t = 1; t < s.ids.size(); ++t) trained += s.trained[t] ? 1 : 0;
  out.ids.insert(out.ids.end(), s.ids.begin(), s.ids.end());
  out.trained.insert(out.trained.end(), s.trained.begin(), s.trained.end());
  out.lengths.push_back(static_cast<int64_t>(s.ids.size()));
  out.lines.push_back(line);
  out.counts.push_back(trained);
}

// A record that cannot be rendered ("FILE:LINE: why"): the block's error, or with
// data.on_bad_record = "skip" counted (the first one kept) — unless the record is well formed
// and the problem is the run's (a chat without a chat template, a text without an eos_token: `e`).
void bad_record(const std::string& why, const std::exception& e, const SampleOptions& o, SampleBlock& out) {
  if (!o.skip_bad_records || dynamic_cast<const NoChatTemplate*>(&e) != nullptr ||
      dynamic_cast<const NoEosToken*>(&e) != nullptr)
    out.error = why;
  else if (out.stats.skipped_bad++ == 0)
    out.stats.first_bad = why;
}

// One preference record into `out` as two samples, chosen then rejected, cut as TRL's
// DataCollatorForPreference cuts them (keep_start: each sequence's first max_ids ids) after
// dropping a pair whose prompt alone fills max_ids; data.truncation = "drop" drops a pair
// either of whose sequences is longer.
void render_pair(const std::string& path, const std::string& separator, const std::string& record, int64_t where,
                 const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o, SampleBlock& out) {
  PreferencePair p;
  try {
    p = render_preference(tok, format, o.trl, record, o.fields, o.ignore_fields);
  } catch (const std::exception& e) {
    bad_record(path + separator + std::to_string(where) + ": " + e.what(), e, o, out);
    return;
  }
  ++(p.conversational ? out.stats.chat : out.stats.text);
  out.stats.prompt_diverged += p.prompt_diverged ? 1 : 0;
  const auto L = static_cast<size_t>(o.max_ids);
  const bool too_long = o.max_ids > 0 && std::max(p.chosen.ids.size(), p.rejected.ids.size()) > L;
  if (too_long && o.drop_too_long) {
    ++out.stats.dropped_too_long;
    return;
  }
  if (o.max_ids > 0 && p.prompt_ids >= o.max_ids) {
    ++out.stats.dropped_prompt_fills;
    return;
  }
  if (too_long) {
    ++out.stats.truncated;
    for (Sample* s : {&p.chosen, &p.rejected})
      if (s->ids.size() > L) {
        s->ids.resize(L);
        s->trained.resize(L);
      }
  }
  ++out.stats.pairs;
  append_sample(p.chosen, where, out);
  append_sample(p.rejected, where, out);
}

// One KTO record into `out`: its examples (one, or a paired record's two, chosen then rejected)
// whole — KTO's rows are cut and its examples ordered when the rows are made (data/rows.h KtoRows),
// as its mismatched KL completions need each completion whole.
void render_kto_examples(const std::string& path, const std::string& separator, const std::string& record,
                         int64_t where, const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o,
                         SampleBlock& out) {
  KtoRecord r;
  try {
    r = render_kto(tok, format, o.trl, record, o.fields, o.ignore_fields);
  } catch (const std::exception& e) {
    bad_record(path + separator + std::to_string(where) + ": " + e.what(), e, o, out);
    return;
  }
  ++(r.conversational ? out.stats.chat : out.stats.text);
  out.stats.pairs += r.paired ? 1 : 0;
  for (const KtoExample& e : r.examples) {
    out.stats.prompt_diverged += e.prompt_diverged ? 1 : 0;
    ++(e.desirable ? out.stats.desirable : out.stats.undesirable);
    append_sample(e.sample, where, out);
  }
}

// Records [begin, end) of a block rendered into `out` (its samples, counts and first error).
void render_range(const std::string& path, const std::string& separator, const std::vector<std::string>& records,
                  const std::vector<int64_t>& where, size_t begin, size_t end, const Tokenizer& tok,
                  const ChatFormat& format, const SampleOptions& o, SampleBlock& out) {
  for (size_t r = begin; r < end; ++r) {
    ++out.stats.records;
    if (o.preference && o.trl.kto) {
      render_kto_examples(path, separator, records[r], where[r], tok, format, o, out);
      if (!out.error.empty()) return;
      continue;
    }
    if (o.preference) {
      render_pair(path, separator, records[r], where[r], tok, format, o, out);
      if (!out.error.empty()) return;
      continue;
    }
    Sample s;
    try {
      s = render_record(tok, format, o.trl, records[r], o.train_on_prompt, out.stats, o.fields, o.ignore_fields);
    } catch (const std::exception& e) {
      bad_record(path + separator + std::to_string(where[r]) + ": " + e.what(), e, o, out);
      if (!out.error.empty()) return;
      continue;
    }
    if (o.max_ids > 0 && static_cast<int64_t>(s.ids.size()) > o.max_ids) {
      if (o.drop_too_long) {
        ++out.stats.dropped_too_long;
        continue;
      }
      ++out.stats.truncated;
      s.ids.resize(o.max_ids);
      s.trained.resize(o.max_ids);
    }
    if (std::none_of(s.trained.begin() + (s.trained.empty() ? 0 : 1), s.trained.end(),
                     [](uint8_t t) { return t != 0; })) {
      ++out.stats.dropped_untrained;
      continue;
    }
    append_sample(s, where[r], out);
  }
}

void add_stats(SampleStats& to, const SampleStats& from) {
  to.records += from.records;
  to.text += from.text;
  to.chat += from.chat;
  to.prompt_completion += from.prompt_completion;
  to.truncated += from.truncated;
  to.dropped_too_long += from.dropped_too_long;
  if (to.skipped_bad == 0 && from.skipped_bad > 0) to.first_bad = from.first_bad;
  to.skipped_bad += from.skipped_bad;
  to.dropped_untrained += from.dropped_untrained;
  to.reasoning_dropped += from.reasoning_dropped;
  to.call_text_dropped += from.call_text_dropped;
  to.pairs += from.pairs;
  to.dropped_prompt_fills += from.dropped_prompt_fills;
  to.prompt_diverged += from.prompt_diverged;
  to.desirable += from.desirable;
  to.undesirable += from.undesirable;
}

// Renders one block of records with up to `threads` threads, each a contiguous share of the
// records (by bytes), and appends the shares in order; the first error in file order throws.
void render_block(const std::string& path, const std::string& separator, const std::vector<std::string>& records,
                  const std::vector<int64_t>& where, const Tokenizer& tok, const ChatFormat& format,
                  const SampleOptions& o, SampleStats& stats, SampleWriter& out) {
  const size_t n = records.size();
  if (n == 0) return;
  const size_t shares = std::clamp<size_t>(static_cast<size_t>(std::max(1, o.threads)), 1, std::max<size_t>(n, 1));
  size_t bytes = 0;
  for (const auto& r : records) bytes += r.size();
  std::vector<size_t> cut{0};  // share k is records [cut[k], cut[k+1])
  size_t seen = 0;
  for (size_t r = 0; r < n && cut.size() < shares; ++r) {
    seen += records[r].size();
    if (seen * shares >= bytes * cut.size()) cut.push_back(r + 1);
  }
  if (cut.back() != n) cut.push_back(n);
  std::vector<SampleBlock> parts(cut.size() - 1);
  std::vector<std::exception_ptr> failed(parts.size());
  auto work = [&](size_t k) {
    try {
      render_range(path, separator, records, where, cut[k], cut[k + 1], tok, format, o, parts[k]);
    } catch (...) {
      failed[k] = std::current_exception();
    }
  };
  std::vector<std::thread> pool;
  for (size_t k = 1; k < parts.size(); ++k) pool.emplace_back(work, k);
  work(0);
  for (auto& t : pool) t.join();
  for (size_t k = 0; k < parts.size(); ++k) {
    if (failed[k]) std::rethrow_exception(failed[k]);
    add_stats(stats, parts[k].stats);
    if (!parts[k].error.empty()) throw RuntimeError(parts[k].error);
    out.append(parts[k]);
  }
}

// The records of a JSONL file, `block_bytes` at a time (whole lines; a longer line is read whole).
void jsonl_blocks(const std::string& path, size_t block_bytes,
                  const std::function<void(std::vector<std::string>&&, std::vector<int64_t>&&, int64_t, int64_t)>& fn) {
  ChunkReader in(path);
  const int64_t total = in.size();
  std::string buf, tail;
  int64_t line = 0, done = 0;
  while (true) {
    const bool last = !in.next(buf, block_bytes);
    std::string text = std::move(tail);
    text += buf;
    size_t usable = last ? text.size() : text.rfind('\n');
    if (usable == std::string::npos) {  // no line end yet: keep reading
      tail = std::move(text);
      continue;
    }
    if (!last) ++usable;
    tail = text.substr(usable);
    std::vector<std::string> records;
    std::vector<int64_t> lines;
    for (size_t pos = 0; pos < usable;) {
      size_t end = text.find('\n', pos);
      end = end == std::string::npos || end >= usable ? usable : end + 1;
      ++line;
      if (text.find_first_not_of(" \t\r\n", pos) < end) {
        records.push_back(text.substr(pos, end - pos));
        lines.push_back(line);
      }
      pos = end;
    }
    done += static_cast<int64_t>(usable);
    fn(std::move(records), std::move(lines), done, total);
    if (last) break;
  }
}

struct MemoryArrays {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;
  std::vector<int64_t> offsets, lines, counts;
};

class MemoryWriter final : public SampleWriter {
 public:
  SampleSet finish(const std::string& source, const SampleStats& stats, DataFormat file_format) {
    auto a = std::make_shared<MemoryArrays>();
    a->ids = std::move(ids_);
    a->trained = std::move(trained_);
    a->offsets = offsets_;
    a->lines = lines_;
    a->counts = counts_;
    return located(assemble(source, stats, a, a->ids.data(), a->trained.data(), a->offsets.data(), a->lines.data(),
                            a->counts.data()),
                   file_format);
  }

 private:
  void store(const SampleBlock& b) override {
    ids_.insert(ids_.end(), b.ids.begin(), b.ids.end());
    trained_.insert(trained_.end(), b.trained.begin(), b.trained.end());
  }
  std::vector<int32_t> ids_;
  std::vector<uint8_t> trained_;
};

}  // namespace

void SampleWriter::append(const SampleBlock& b) {
  size_t at = 0;
  for (size_t i = 0; i < b.lengths.size(); ++i) {
    const int64_t n = b.lengths[i];
    hash_ = hash_values(hash_, b.ids.data() + at, n);
    hash_ = hash_values(hash_, b.trained.data() + at, n);
    at += static_cast<size_t>(n);
    offsets_.push_back(offsets_.back() + n);
    lines_.push_back(b.lines[i]);
    counts_.push_back(b.counts[i]);
    total_trained_ += b.counts[i];
  }
  for (int32_t id : b.ids) max_id_ = std::max(max_id_, id);
  store(b);
}

SampleSet SampleWriter::assemble(std::string source, SampleStats stats, std::shared_ptr<const void> storage,
                                 const int32_t* ids, const uint8_t* trained, const int64_t* offsets,
                                 const int64_t* lines, const int64_t* counts) const {
  return assemble(std::move(source), std::move(stats), std::move(storage), ids, trained, offsets, lines, counts,
                  samples(), total_trained_, max_id_, hash_);
}

SampleSet SampleWriter::assemble(std::string source, SampleStats stats, std::shared_ptr<const void> storage,
                                 const int32_t* ids, const uint8_t* trained, const int64_t* offsets,
                                 const int64_t* lines, const int64_t* counts, int64_t n, int64_t total_trained,
                                 int32_t max_id, uint64_t hash) {
  SampleSet s;
  s.source_ = std::move(source);
  s.stats = std::move(stats);
  s.storage_ = std::move(storage);
  s.ids_ = ids;
  s.trained_ = trained;
  s.offsets_ = offsets;
  s.lines_ = lines;
  s.counts_ = counts;
  s.n_ = n;
  s.total_trained_ = total_trained;
  s.max_id_ = max_id;
  s.content_hash_ = hash;
  return s;
}

const char* record_separator(DataFormat file_format) {
  switch (file_format) {
    case DataFormat::parquet:
      return ": row ";
    case DataFormat::json:
      return ": record ";
    default:
      return ":";
  }
}

SampleStats render_samples(const std::string& path, DataFormat file_format, const Tokenizer& tok,
                           const ChatFormat& format, const SampleOptions& o, const SampleProgress& progress,
                           SampleWriter& out) {
  SampleStats stats;
  int64_t total = 0;
  const size_t block_bytes = static_cast<size_t>(std::max<int64_t>(1, o.block_bytes));
  if (file_format == DataFormat::parquet) {
    parquet_records(
        path,
        [&](std::vector<std::string>&& records, int64_t first, int64_t rows) {
          std::vector<int64_t> where(records.size());
          std::iota(where.begin(), where.end(), first + 1);
          render_block(path, ": row ", records, where, tok, format, o, stats, out);
          total = rows;
          if (progress) progress(first + static_cast<int64_t>(records.size()), rows, out.ids());
        },
        o.ignore_fields);
  } else if (file_format == DataFormat::json) {
    json_array_blocks(
        path, block_bytes,
        [&](std::vector<std::string>&& records, std::vector<int64_t>&& index, int64_t done, int64_t bytes) {
          render_block(path, ": record ", records, index, tok, format, o, stats, out);
          total = bytes;
          if (progress) progress(done, bytes, out.ids());
        });
  } else {
    jsonl_blocks(path, block_bytes,
                 [&](std::vector<std::string>&& records, std::vector<int64_t>&& lines, int64_t done, int64_t bytes) {
                   render_block(path, ":", records, lines, tok, format, o, stats, out);
                   total = bytes;
                   if (progress) progress(done, bytes, out.ids());
                 });
  }
  if (progress) progress(total, total, out.ids());
  return stats;
}

SampleSet SampleSet::from_file(const std::string& path, DataFormat file_format, const Tokenizer& tok,
                               const ChatFormat& format, const SampleOptions& o, const SampleProgress& progress) {
  MemoryWriter w;
  const SampleStats stats = render_samples(path, file_format, tok, format, o, progress, w);
  return w.finish(path, stats, file_format);
}

}  // namespace ptrain
