#include "data/chat.h"

#include <algorithm>
#include <ctime>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <tuple>

#include "common/error.h"
#include "common/fs_util.h"
#include "data/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// Jinja's `trim` (Python's str.strip(): ASCII whitespace here, as the templates' content is).
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

constexpr const char* kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// What a template renders, as pieces of text, each trained or not.
struct Part {
  std::string text;
  bool trained;
};

// The parts' ids, exactly as encoding their concatenation does: the text splits at the added
// tokens a part is exactly (those split any text cleanly); each stretch between them is encoded
// whole, and a part's ids are what it adds to the encoding of the stretch so far.
Sample tokenize_parts(const Tokenizer& tok, const std::vector<Part>& parts, bool train_all) {
  Sample s;
  auto add = [&](const std::vector<int32_t>& ids, size_t from, bool trained) {
    s.ids.insert(s.ids.end(), ids.begin() + static_cast<std::ptrdiff_t>(from), ids.end());
    s.trained.insert(s.trained.end(), ids.size() - from, trained || train_all);
  };
  std::string stretch;
  std::vector<int32_t> so_far;
  bool at_start = true;  // the stretch begins the text
  for (const Part& p : parts) {
    if (auto id = tok.splitting_token(p.text)) {
      add({*id}, 0, p.trained);
      stretch.clear();
      so_far.clear();
      at_start = false;
      continue;
    }
    stretch += p.text;
    const std::vector<int32_t> ids = tok.encode(stretch, at_start);
    if (!std::equal(so_far.begin(), so_far.end(), ids.begin(),
                    ids.begin() + static_cast<std::ptrdiff_t>(std::min(so_far.size(), ids.size()))) ||
        ids.size() < so_far.size())
      throw RuntimeError("the tokenizer merges the start of \"" + p.text.substr(0, 40) +
                         "\" with the template text before it into one token, so no token boundary separates what is "
                         "trained from what is not");
    add(ids, so_far.size(), p.trained);
    so_far = ids;
  }
  return s;
}

// The directory's chat template text: chat_template.jinja, else tokenizer_config.json's
// chat_template (a string, or a list of named templates: "default").
std::string template_text(const fs::path& dir, std::string& where) {
  if (fs::is_regular_file(dir / "chat_template.jinja")) {
    where = (dir / "chat_template.jinja").string();
    return read_text_file(where);
  }
  const fs::path cfg = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg)) return "";
  where = cfg.string();
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(read_text_file(where));
  } catch (const nlohmann::json::exception& e) {
    throw RuntimeError(where + ": not valid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object() || !j.contains("chat_template") || j["chat_template"].is_null()) return "";
  const auto& t = j["chat_template"];
  if (t.is_string()) return t.get<std::string>();
  if (t.is_array())
    for (const auto& named : t)
      if (named.is_object() && named.value("name", "") == "default" && named.contains("template"))
        return named["template"].get<std::string>();
  throw RuntimeError(where + ": chat_template is neither a string nor a list holding a \"default\" template");
}

// tokenizer_config.json's bos_token / eos_token ("" when absent or null).
std::string config_token(const fs::path& dir, const char* key) {
  const fs::path cfg = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg)) return "";
  try {
    const auto j = nlohmann::json::parse(read_text_file(cfg.string()));
    if (!j.is_object() || !j.contains(key)) return "";
    const auto& v = j[key];
    if (v.is_string()) return v.get<std::string>();
    if (v.is_object() && v.contains("content") && v["content"].is_string()) return v["content"].get<std::string>();
  } catch (const nlohmann::json::exception&) {
  }
  return "";
}

bool has(const std::string& text, const char* needle) { return text.find(needle) != std::string::npos; }

}  // namespace

std::vector<int64_t> Sample::targets() const {
  std::vector<int64_t> t;
  for (size_t i = 1; i < ids.size(); ++i) t.push_back(trained[i] ? ids[i] : -100);
  return t;
}

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> n{"auto",    "llama3", "llama3.1", "llama3.2",
                                          "qwen2.5", "qwen3",  "chatml",   "mistral"};
  return n;
}

std::pair<std::string, std::string> document_markers(const Tokenizer& tok) {
  const fs::path dir = fs::path(tok.path()).parent_path();
  auto first_present = [&](const std::vector<std::string>& names) {
    for (const auto& name : names)
      if (!name.empty() && tok.splitting_token(name)) return name;
    return std::string();
  };
  return {first_present({"<|begin_of_text|>", config_token(dir, "bos_token"), "<s>"}),
          first_present({"<|end_of_text|>", "<|endoftext|>", config_token(dir, "eos_token"), "</s>"})};
}

ChatFormat chat_format(const Tokenizer& tok, ChatTemplate requested) {
  const fs::path dir = fs::path(tok.path()).parent_path();
  ChatFormat f;
  std::tie(f.bos, f.eos) = document_markers(tok);
  f.kind = requested;
  f.source = "data.chat_template";
  if (requested == ChatTemplate::automatic) {
    std::string where;
    const std::string t = template_text(dir, where);
    f.source = where;
    const std::string options =
        " (set data.chat_template to one of llama3, llama3.1, llama3.2, qwen2.5, qwen3, chatml, mistral "
        "if your data was made for one of them)";
    if (t.empty()) {
      if (!tok.splitting_token("<|start_header_id|>"))
        throw RuntimeError("no chat template in " + dir.string() +
                           " (tokenizer_config.json / chat_template.jinja) and the tokenizer is not Llama 3's" +
                           options);
      f.kind = ChatTemplate::llama3;
      f.source = "Llama 3's header tokens (no template in " + dir.string() + ")";
    } else if (has(t, "<|start_header_id|>")) {
      f.kind = !has(t, "Cutting Knowledge Date") ? ChatTemplate::llama3
               : has(t, "strftime_now")          ? ChatTemplate::llama3_2
                                                 : ChatTemplate::llama3_1;
    } else if (has(t, "<|im_start|>")) {
      if (has(t, "<think>") && !has(t, "last_query_index"))
        throw RuntimeError(where +
                           ": this ChatML template with <think> blocks (QwQ, distilled reasoners) is not one ptrain "
                           "renders; Qwen3's is" +
                           options);
      f.kind = has(t, "<think>")     ? ChatTemplate::qwen3
               : has(t, kQwenSystem) ? ChatTemplate::qwen2_5
                                     : ChatTemplate::chatml;
    } else if (has(t, "[INST]")) {
      if (!has(t, "loop.last and system_message is defined") || !has(t, "\"[INST] \""))
        throw RuntimeError(where +
                           ": this Mistral chat template (v0.1 / v0.2 / Nemo) is not implemented; ptrain renders "
                           "Mistral v0.3's" +
                           options);
      f.kind = ChatTemplate::mistral;
    } else {
      throw RuntimeError(where + ": the chat template is not one ptrain recognizes" + options);
    }
  }
  if (f.kind == ChatTemplate::llama3_1) f.date = "26 Jul 2024";
  if (f.kind == ChatTemplate::llama3_2) {  // the template's strftime_now("%d %b %Y"), as transformers renders it
    const std::time_t now = std::time(nullptr);
    std::tm tm{};
    localtime_r(&now, &tm);
    char buf[32];
    std::strftime(buf, sizeof buf, "%d %b %Y", &tm);
    f.date = buf;
  }
  return f;
}

Sample render_chat(const Tokenizer& tok, const ChatFormat& f, const std::vector<ChatMessage>& messages,
                   bool train_on_prompt) {
  std::vector<Part> parts;
  auto role_check = [&](const ChatMessage& m, std::initializer_list<const char*> roles) {
    for (const char* r : roles)
      if (m.role == r) return;
    std::string names;
    for (const char* r : roles) names += (names.empty() ? "" : ", ") + std::string(r);
    throw RuntimeError("unknown role '" + m.role + "' in a chat message (" +
                       chat_template_names()[static_cast<size_t>(f.kind)] + " takes " + names + ")");
  };
  switch (f.kind) {
    case ChatTemplate::llama3:
    case ChatTemplate::llama3_1:
    case ChatTemplate::llama3_2: {
      parts.push_back({"<|begin_of_text|>", false});
      size_t first = 0;
      if (f.kind != ChatTemplate::llama3) {  // the dated system header, the system message in it
        const bool system = !messages.empty() && messages[0].role == "system";
        parts.push_back({"<|start_header_id|>", false});
        parts.push_back({"system", false});
        parts.push_back({"<|end_header_id|>", false});
        parts.push_back({"\n\nCutting Knowledge Date: December 2023\nToday Date: " + f.date + "\n\n" +
                             (system ? trim(messages[0].content) : std::string()),
                         false});
        parts.push_back({"<|eot_id|>", false});
        first = system ? 1 : 0;
      }
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        role_check(m, {"system", "user", "assistant", "ipython"});
        const bool reply = m.role == "assistant";
        parts.push_back({"<|start_header_id|>", false});
        parts.push_back({m.role, false});
        parts.push_back({"<|end_header_id|>", false});
        parts.push_back({"\n\n", false});
        parts.push_back({trim(m.content), reply});
        parts.push_back({"<|eot_id|>", reply});
      }
      break;
    }
    case ChatTemplate::qwen2_5:
    case ChatTemplate::chatml: {
      size_t first = 0;
      if (f.kind == ChatTemplate::qwen2_5 && (messages.empty() || messages[0].role != "system")) {
        parts.push_back({"<|im_start|>", false});
        parts.push_back({std::string("system\n") + kQwenSystem, false});
        parts.push_back({"<|im_end|>", false});
        parts.push_back({"\n", false});
      }
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        role_check(m, {"system", "user", "assistant"});
        const bool reply = m.role == "assistant";
        parts.push_back({"<|im_start|>", false});
        parts.push_back({m.role + "\n", false});
        parts.push_back({m.content, reply});
        parts.push_back({"<|im_end|>", reply});
        parts.push_back({"\n", reply});
      }
      break;
    }
    case ChatTemplate::qwen3: {
      // The last user turn: replies after it keep their reasoning, earlier ones lose it.
      size_t last_query = messages.empty() ? 0 : messages.size() - 1;
      for (size_t i = messages.size(); i-- > 0;)
        if (messages[i].role == "user" &&
            !(messages[i].content.rfind("<tool_response>", 0) == 0 && messages[i].content.size() >= 16 &&
              messages[i].content.compare(messages[i].content.size() - 16, 16, "</tool_response>") == 0)) {
          last_query = i;
          break;
        }
      auto strip_nl = [](const std::string& s, bool left, bool right) {
        size_t b = 0, e = s.size();
        while (left && b < e && s[b] == '\n') ++b;
        while (right && e > b && s[e - 1] == '\n') --e;
        return s.substr(b, e - b);
      };
      for (size_t i = 0; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        role_check(m, {"system", "user", "assistant"});
        parts.push_back({"<|im_start|>", false});
        if (m.role != "assistant") {
          parts.push_back({m.role + "\n" + m.content, false});
          parts.push_back({"<|im_end|>", false});
          parts.push_back({"\n", false});
          continue;
        }
        std::string content = m.content, reasoning;
        const size_t close = content.find("</think>");
        if (close != std::string::npos) {  // Python's split('</think>')[0] / [-1]
          std::string before = strip_nl(content.substr(0, close), false, true);
          const size_t open = before.rfind("<think>");
          reasoning = strip_nl(open == std::string::npos ? before : before.substr(open + 7), true, false);
          content = strip_nl(content.substr(content.rfind("</think>") + 8), true, false);
        }
        parts.push_back({"assistant\n", false});
        if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
          parts.push_back({"<think>", true});
          parts.push_back({"\n" + strip_nl(reasoning, true, true) + "\n", true});
          parts.push_back({"</think>", true});
          parts.push_back({"\n\n" + strip_nl(content, true, false), true});
        } else {
          parts.push_back({content, true});
        }
        parts.push_back({"<|im_end|>", true});
        parts.push_back({"\n", true});
      }
      break;
    }
    case ChatTemplate::mistral: {
      const bool system = !messages.empty() && messages[0].role == "system";
      const size_t first = system ? 1 : 0;
      parts.push_back({"<s>", false});
      for (size_t i = first; i < messages.size(); ++i) {
        const ChatMessage& m = messages[i];
        role_check(m, {"user", "assistant"});
        if ((m.role == "user") != ((i - first) % 2 == 0))
          throw RuntimeError(
              "mistral's template takes an optional system message, then user and assistant turns "
              "alternating, starting with user");
        if (m.role == "user") {
          parts.push_back({"[INST]", false});
          const bool last = i + 1 == messages.size();
          parts.push_back({" " + (last && system ? messages[0].content + "\n\n" : std::string()) + m.content, false});
          parts.push_back({"[/INST]", false});
        } else {
          parts.push_back({" " + trim(m.content), true});
          parts.push_back({"</s>", true});
        }
      }
      break;
    }
    case ChatTemplate::automatic:
      throw RuntimeError("render_chat needs a resolved chat format (chat_format)");
  }
  return tokenize_parts(tok, parts, train_on_prompt);
}

std::vector<int32_t> render_prompt(const Tokenizer& tok, const ChatFormat& f,
                                   const std::vector<ChatMessage>& messages) {
  if (messages.empty() || messages.back().role != "user")
    throw RuntimeError("a prompt to answer must end with a user message");
  std::vector<int32_t> ids = render_chat(tok, f, messages, /*train_on_prompt=*/true).ids;
  std::vector<Part> cue;
  switch (f.kind) {
    case ChatTemplate::llama3:
    case ChatTemplate::llama3_1:
    case ChatTemplate::llama3_2:
      cue = {{"<|start_header_id|>", false}, {"assistant", false}, {"<|end_header_id|>", false}, {"\n\n", false}};
      break;
    case ChatTemplate::qwen2_5:
    case ChatTemplate::qwen3:
    case ChatTemplate::chatml:
      cue = {{"<|im_start|>", false}, {"assistant\n", false}};
      break;
    case ChatTemplate::mistral:
    case ChatTemplate::automatic:
      break;
  }
  const std::vector<int32_t> more = tokenize_parts(tok, cue, true).ids;
  ids.insert(ids.end(), more.begin(), more.end());
  return ids;
}

std::string end_of_turn(const ChatFormat& f) {
  switch (f.kind) {
    case ChatTemplate::qwen2_5:
    case ChatTemplate::qwen3:
    case ChatTemplate::chatml:
      return "<|im_end|>";
    case ChatTemplate::mistral:
      return "</s>";
    default:
      return "<|eot_id|>";
  }
}

Sample render_document(const Tokenizer& tok, const ChatFormat& f,
                       const std::vector<std::pair<std::string, bool>>& parts, bool train_all) {
  Sample s;
  auto add = [&](const std::vector<int32_t>& ids, bool trained) {
    s.ids.insert(s.ids.end(), ids.begin(), ids.end());
    s.trained.insert(s.trained.end(), ids.size(), trained || train_all);
  };
  if (!f.bos.empty()) add({*tok.splitting_token(f.bos)}, false);
  for (const auto& [text, trained] : parts) add(tok.encode(text), trained);
  if (!f.eos.empty()) add({*tok.splitting_token(f.eos)}, true);
  return s;
}

}  // namespace ptrain
