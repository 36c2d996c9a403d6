#include "data/chat.h"

#include <algorithm>

#include "common/error.h"
#include "data/tokenizer.h"

namespace ptrain {

namespace {

int32_t special(const Tokenizer& tok, const std::string& token) {
  auto id = tok.id_of(token);
  if (!id) throw RuntimeError(tok.path() + " has no " + token + " token: not a Llama 3 chat tokenizer");
  return *id;
}

// Jinja's `trim` on ASCII whitespace.
std::string trim(const std::string& s) {
  const char* ws = " \t\n\r\v\f";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

}  // namespace

std::vector<int64_t> Sample::targets() const {
  std::vector<int64_t> t;
  for (size_t i = 1; i < ids.size(); ++i) t.push_back(trained[i] ? ids[i] : -100);
  return t;
}

Sample render_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages, bool train_on_prompt) {
  static const std::vector<std::string> kRoles{"system", "user", "assistant", "ipython"};
  const int32_t bos = special(tok, "<|begin_of_text|>"), start = special(tok, "<|start_header_id|>"),
                end = special(tok, "<|end_header_id|>"), eot = special(tok, "<|eot_id|>");
  Sample s;
  auto add = [&](const std::vector<int32_t>& ids, bool trained) {
    s.ids.insert(s.ids.end(), ids.begin(), ids.end());
    s.trained.insert(s.trained.end(), ids.size(), trained || train_on_prompt);
  };
  add({bos}, false);
  for (const auto& m : messages) {
    if (std::find(kRoles.begin(), kRoles.end(), m.role) == kRoles.end())
      throw RuntimeError("unknown role '" + m.role + "' in a chat message (system, user, assistant, ipython)");
    const bool reply = m.role == "assistant";
    add({start}, false);
    add(tok.encode(m.role), false);
    add({end}, false);
    // "\n\n" is a piece of its own before trimmed content, so encoding it apart gives the ids
    // of the whole rendered text (Tokenizer tests check it against transformers).
    add(tok.encode("\n\n"), false);
    add(tok.encode(trim(m.content)), reply);
    add({eot}, reply);
  }
  return s;
}

}  // namespace ptrain
