#include "tokenizer/template_scan.h"

#include <algorithm>
#include <cstdint>

#include "common/error.h"
#include "common/utf8.h"

namespace ptrain {

namespace {

struct Token {
  enum Kind { name, string, other } kind;
  std::string text;     // the name, the unescaped string, or the punctuation / number character(s)
  bool spaced = false;  // whitespace before it
};

bool is_name_start(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }
bool is_name_char(char c) { return is_name_start(c) || (c >= '0' && c <= '9'); }
bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; }

int hex_value(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

// A Python string escape's character (after the backslash), or none: a line continuation gives
// nothing, an unknown escape stays as written.
std::string simple_escape(char e) {
  switch (e) {
    case 'n':
      return "\n";
    case 't':
      return "\t";
    case 'r':
      return "\r";
    case 'b':
      return "\b";
    case 'f':
      return "\f";
    case 'v':
      return "\v";
    case '\\':
      return "\\";
    case '\'':
      return "'";
    case '"':
      return "\"";
    case '\n':
      return "";  // a line continuation
    default:
      return std::string("\\") + e;
  }
}

// A string literal whose opening quote is at `pos`, unescaped as Python does; leaves `pos` past
// its closing quote.
std::string lex_string(const std::string& t, size_t& pos, int line) {
  const char quote = t[pos];
  std::string s;
  size_t i = pos + 1;
  for (; i < t.size() && t[i] != quote; ++i) {
    if (t[i] != '\\' || i + 1 >= t.size()) {
      s += t[i];
      continue;
    }
    const char e = t[++i];
    const int digits = e == 'x' ? 2 : e == 'u' ? 4 : e == 'U' ? 8 : 0;
    if (digits == 0) {
      s += simple_escape(e);
      continue;
    }
    uint32_t cp = 0;
    bool ok = i + static_cast<size_t>(digits) < t.size();
    for (int k = 1; ok && k <= digits; ++k) {
      const int v = hex_value(t[i + static_cast<size_t>(k)]);
      ok = v >= 0;
      cp = cp * 16 + static_cast<uint32_t>(std::max(v, 0));
    }
    if (!ok || cp > 0x10FFFF)
      throw RuntimeError("line " + std::to_string(line) + ": a string literal has a malformed \\" + std::string(1, e) +
                         " escape");
    s += utf8(cp);
    i += static_cast<size_t>(digits);
  }
  if (i >= t.size()) throw RuntimeError("line " + std::to_string(line) + ": a string literal is never closed");
  pos = i + 1;
  return s;
}

// One tag's tokens, from `pos` (just past its opening and whitespace-control character) to its
// end ("}}" for an expression, "%}" for a statement, outside strings and brackets). Leaves `pos`
// past the end; `close_dash` tells whether the tag ends with "-".
std::vector<Token> lex_tag(const std::string& t, size_t& pos, bool statement, int line, bool& close_dash) {
  std::vector<Token> out;
  int depth = 0;
  const char end0 = statement ? '%' : '}';
  bool spaced = false;
  while (true) {
    if (pos >= t.size())
      throw RuntimeError("line " + std::to_string(line) + ": a " + (statement ? "{% ... %}" : "{{ ... }}") +
                         " tag is never closed");
    const char c = t[pos];
    if (depth == 0 && c == '-' && pos + 2 < t.size() && t[pos + 1] == end0 && t[pos + 2] == '}') {
      close_dash = true;
      pos += 3;
      return out;
    }
    if (depth == 0 && c == end0 && pos + 1 < t.size() && t[pos + 1] == '}') {
      close_dash = false;
      pos += 2;
      return out;
    }
    if (is_space(c)) {
      ++pos;
      spaced = true;
      continue;
    }
    if (c == '\'' || c == '"') {
      out.push_back({Token::string, lex_string(t, pos, line), spaced});
    } else if (is_name_start(c)) {
      size_t e = pos;
      while (e < t.size() && is_name_char(t[e])) ++e;
      out.push_back({Token::name, t.substr(pos, e - pos), spaced});
      pos = e;
    } else {
      if (c == '(' || c == '[' || c == '{') ++depth;
      if ((c == ')' || c == ']' || c == '}') && depth > 0) --depth;
      out.push_back({Token::other, std::string(1, c), spaced});
      ++pos;
    }
    spaced = false;
  }
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }

// A tag's tokens as TemplateScan::Tag::code holds them: a number's digits and a two-character
// operator written without a space inside are one token ("= =" is not "==").
void append_code(std::vector<std::string>& code, bool& last_other, const Token& tok) {
  if (tok.kind == Token::string) {
    code.push_back("'" + tok.text);
  } else if (tok.kind == Token::other && last_other && !tok.spaced && !code.empty()) {
    const std::string& prev = code.back();
    const std::string joined = prev + tok.text;
    const bool number = is_digit(prev.back()) && is_digit(tok.text[0]) && is_digit(prev[0]);
    if (number || joined == "==" || joined == "!=" || joined == "<=" || joined == ">=" || joined == "//" ||
        joined == "**")
      code.back() = joined;
    else
      code.push_back(tok.text);
  } else {
    code.push_back(tok.text);
  }
  last_other = tok.kind == Token::other;
}

std::string collapsed(const std::string& text) {
  std::string out;
  for (char c : text) {
    if (!is_space(c))
      out += c;
    else if (!out.empty() && out.back() != ' ')
      out += ' ';
  }
  return out;
}

// tokens [b, e) are a variable path: NAME, then .NAME or [LITERAL] any number of times.
bool is_path(const std::vector<Token>& t, size_t b, size_t e) {
  if (b >= e || t[b].kind != Token::name) return false;
  for (size_t i = b + 1; i < e;) {
    if (t[i].text == "." && i + 1 < e && t[i + 1].kind == Token::name) {
      i += 2;
    } else if (t[i].text == "[" && i + 2 < e && t[i + 1].kind != Token::name && t[i + 2].text == "]") {
      i += 3;
    } else {
      return false;
    }
  }
  return true;
}

// tokens [b, e) are a path ending in the attribute or key `attr` (x.attr, x["attr"]).
bool path_to(const std::vector<Token>& t, size_t b, size_t e, const char* attr) {
  if (!is_path(t, b, e) || e - b < 3) return false;
  if (t[e - 1].kind == Token::name && t[e - 1].text == attr && t[e - 2].text == ".") return true;
  return t[e - 1].text == "]" && t[e - 2].kind == Token::string && t[e - 2].text == attr;
}

bool tool_condition(const std::vector<Token>& cond, int nesting = 0);

// A term of a condition (no top-level and / or) that is false for every chat without tools as
// transformers renders it (tools passed as none, no tool_calls, no tool messages): `tools`,
// `tools is not none`, `not tools is none`, `custom_tools` / `builtin_tools` (is defined),
// `x.tool_calls` (is defined), `'tool_calls' in x`, `x.role == 'tool' | 'ipython' | 'tool_results'`;
// and `x.content is none` (a message without content: a tool call's — every message ptrain renders
// has a string content). Anything else may hold without tools.
bool positive_tool_term(const std::vector<Token>& t, int nesting = 0) {
  const size_t n = t.size();
  auto is = [&](size_t i, const char* text) { return i < n && t[i].kind == Token::name && t[i].text == text; };
  if (n >= 2 && t.front().text == "(" && t.back().text == ")") {  // a parenthesized condition
    int depth = 0;
    size_t close = 0;
    for (size_t i = 0; i < n && !close; ++i) {
      if (t[i].kind == Token::other && t[i].text == "(") ++depth;
      if (t[i].kind == Token::other && t[i].text == ")" && --depth == 0) close = i;
    }
    // (beyond 32 levels of parentheses a condition is taken to hold without tools: it counts)
    if (close == n - 1)
      return nesting < 32 && tool_condition(std::vector<Token>(t.begin() + 1, t.end() - 1), nesting + 1);
  }
  auto tools_input = [&](size_t i) { return is(i, "tools") || is(i, "custom_tools") || is(i, "builtin_tools"); };
  if (n == 1 && tools_input(0)) return true;
  if (path_to(t, 0, n, "tool_calls")) return true;
  if (n == 4 && is(0, "tools") && is(1, "is") && is(2, "not") && is(3, "none")) return true;
  if (n == 4 && is(0, "not") && is(1, "tools") && is(2, "is") && is(3, "none")) return true;
  if (n >= 3 && is(n - 2, "is") && is(n - 1, "defined") &&
      ((n == 3 && (is(0, "custom_tools") || is(0, "builtin_tools"))) || path_to(t, 0, n - 2, "tool_calls")))
    return true;
  if (n >= 3 && t[0].kind == Token::string && t[0].text == "tool_calls" && is(1, "in") && is_path(t, 2, n)) return true;
  if (n >= 5 && is(n - 2, "is") && is(n - 1, "none") && path_to(t, 0, n - 2, "content")) return true;
  if (n >= 4 && t[n - 2].text == "=" && t[n - 3].text == "=" && t[n - 1].kind == Token::string &&
      (t[n - 1].text == "tool" || t[n - 1].text == "ipython" || t[n - 1].text == "tool_results") &&
      path_to(t, 0, n - 3, "role"))
    return true;
  return false;
}

// A condition that holds only for chats with tools: every top-level `or` alternative has a
// positive tool term among its `and`-ed terms.
bool tool_condition(const std::vector<Token>& cond, int nesting) {
  if (cond.empty()) return false;
  std::vector<std::vector<std::vector<Token>>> alternatives(1, std::vector<std::vector<Token>>(1));
  int depth = 0;
  for (const Token& tok : cond) {
    if (tok.kind == Token::other && (tok.text == "(" || tok.text == "[" || tok.text == "{")) ++depth;
    if (tok.kind == Token::other && (tok.text == ")" || tok.text == "]" || tok.text == "}")) --depth;
    if (depth == 0 && tok.kind == Token::name && tok.text == "or") {
      alternatives.emplace_back(1);
    } else if (depth == 0 && tok.kind == Token::name && tok.text == "and") {
      alternatives.back().emplace_back();
    } else {
      alternatives.back().back().push_back(tok);
    }
  }
  return std::all_of(alternatives.begin(), alternatives.end(), [&](const auto& terms) {
    return std::any_of(terms.begin(), terms.end(), [&](const auto& term) { return positive_tool_term(term, nesting); });
  });
}

// The text outside tags, as trim_blocks / lstrip_blocks / "-" leave it to render.
std::string rendered_text(std::string raw, bool after_block, bool after_dash, bool before_block, bool before_dash,
                          bool before_plus, bool at_line_start) {
  if (after_dash) {
    raw.erase(0, std::find_if_not(raw.begin(), raw.end(), is_space) - raw.begin());
  } else if (after_block) {
    if (raw.rfind("\r\n", 0) == 0)
      raw.erase(0, 2);
    else if (raw.rfind('\n', 0) == 0)
      raw.erase(0, 1);
  }
  if (before_dash) {
    while (!raw.empty() && is_space(raw.back())) raw.pop_back();
  } else if (before_block && !before_plus) {
    const size_t nl = raw.find_last_of('\n');
    const size_t from = nl == std::string::npos ? 0 : nl + 1;
    if ((nl != std::string::npos || at_line_start) && raw.find_first_not_of(" \t", from) == std::string::npos)
      raw.erase(from);
  }
  return raw;
}

}  // namespace

namespace {

// One pass over a template: the text it renders, its tags (outside tool branches), the string
// literals and features its code uses; blocks are tracked to tell tool branches apart.
class Scanner {
 public:
  explicit Scanner(const std::string& t) : t_(t) {}

  TemplateScan run() {
    size_t pos = 0;
    bool prev_block = false, prev_dash = false, prev_any = false;
    while (pos <= t_.size()) {
      const size_t open = next_tag(pos);
      const bool block = open < t_.size() && t_[open + 1] != '{';
      const char mark = open + 2 < t_.size() ? t_[open + 2] : '\0';
      const std::string out =
          rendered_text(t_.substr(pos, open - pos), prev_block, prev_dash, block && open < t_.size(),
                        open < t_.size() && mark == '-', mark == '+', !prev_any);
      // Text inside a tool branch renders for no chat without tools, like the branch's tags.
      if (!out.empty()) (in_tool() ? scan_.tool_output_text : scan_.output_text).push_back({out, line_at(pos)});
      if (open >= t_.size()) break;
      const int line = line_at(open);
      pos = open + 2 + ((mark == '-' || mark == '+') ? 1 : 0);
      prev_any = true;
      prev_block = block;
      if (t_[open + 1] == '#') {
        pos = skip_comment(pos, line, prev_dash);
        continue;
      }
      const bool statement = t_[open + 1] == '%';
      const std::vector<Token> toks = lex_tag(t_, pos, statement, line, prev_dash);
      TemplateScan::Tag tag{{statement ? "{%" : "{{"}, collapsed(t_.substr(open, pos - open)), line};
      TemplateScan::Tag whole = tag;
      bool shown = true;  // whether the tag goes into scan.tags (given it is outside tool branches)
      if (statement) shown = read_statement(toks, line, tag);
      count_tokens(toks, 0, line, whole, /*count=*/false);
      scan_.every_tag.push_back(std::move(whole));
      // A tool branch's own condition counts no more than its body: without tools it is false.
      if (in_tool()) continue;
      count_tokens(toks, statement ? 1 : 0, line, tag);
      if (shown) scan_.tags.push_back(std::move(tag));
    }
    if (!blocks_.empty())
      throw RuntimeError("the template ends inside an {% " + blocks_.back().keyword + " %} that is never closed");
    return std::move(scan_);
  }

 private:
  struct Block {
    std::string keyword;
    bool tool;
    bool shown = false;  // its opening tag is in scan.tags (not when only tool branches came before)
  };

  bool in_tool() const { return first_tool_ != SIZE_MAX; }
  // Inside an open tool branch other than the innermost block's own.
  bool in_outer_tool() const { return first_tool_ != SIZE_MAX && first_tool_ + 1 < blocks_.size(); }
  void set_back_tool(bool tool) {
    blocks_.back().tool = tool;
    if (tool && first_tool_ == SIZE_MAX) first_tool_ = blocks_.size() - 1;
    if (!tool && first_tool_ == blocks_.size() - 1) first_tool_ = SIZE_MAX;
  }
  void push(const std::string& keyword, bool tool) {
    blocks_.push_back({keyword, false});
    set_back_tool(tool);
    blocks_.back().shown = !in_tool();
  }
  // Lines are counted once, up to the furthest position asked (positions only grow).
  int line_at(size_t p) {
    lines_ += static_cast<int>(std::count(t_.begin() + static_cast<std::ptrdiff_t>(counted_),
                                          t_.begin() + static_cast<std::ptrdiff_t>(p), '\n'));
    counted_ = p;
    return lines_;
  }
  // The next "{{", "{%" or "{#" from pos, in one pass; the template's size where there is none.
  size_t next_tag(size_t pos) const {
    size_t open = pos;
    while ((open = t_.find('{', open)) != std::string::npos && open + 1 < t_.size() && t_[open + 1] != '{' &&
           t_[open + 1] != '%' && t_[open + 1] != '#')
      ++open;
    return open == std::string::npos || open + 1 >= t_.size() ? t_.size() : open;
  }
  size_t skip_comment(size_t pos, int line, bool& close_dash) const {
    const size_t close = t_.find("#}", pos);
    if (close == std::string::npos) throw RuntimeError("line " + std::to_string(line) + ": a comment is never closed");
    close_dash = close > 0 && t_[close - 1] == '-';
    return close + 2;
  }

  // {% elif %} / {% else %}: the first branch reached without tools stands in for the block.
  bool read_branch(const std::string& kw, const std::vector<Token>& rest, int line, TemplateScan::Tag& tag) {
    if (blocks_.empty() || (blocks_.back().keyword != "if" && blocks_.back().keyword != "for"))
      throw RuntimeError("line " + std::to_string(line) + ": {% " + kw + " %} outside an {% if %}");
    const bool outer = in_outer_tool();
    set_back_tool(kw == "elif" && tool_condition(rest));
    Block& b = blocks_.back();
    if (outer || b.shown || b.tool) return true;
    if (kw == "else" && b.keyword == "for")
      scan_.unsupported.push_back("line " + std::to_string(line) + ": {% else %} of a {% for %} over tools");
    if (kw == "elif") tag.code.back() = "if";  // {% if tools %}A{% elif c %}B: {% if c %}B
    b.shown = kw == "elif";                    // {% if tools %}A{% else %}B: B alone
    return kw == "elif";
  }

  // A statement tag: blocks opened and closed, unsupported statements listed. Returns whether
  // the tag is shown.
  bool read_statement(const std::vector<Token>& toks, int line, TemplateScan::Tag& tag) {
    const std::string kw = toks.empty() ? "" : toks[0].text;
    const std::vector<Token> rest(toks.begin() + (toks.empty() ? 0 : 1), toks.end());
    tag.code.push_back(kw);
    if (kw == "if") {
      push(kw, tool_condition(rest));
    } else if (kw == "elif" || kw == "else") {
      return read_branch(kw, rest, line, tag);
    } else if (kw == "for") {  // over tools or a message's tool calls
      const auto in = std::find_if(rest.begin(), rest.end(),
                                   [](const Token& tok) { return tok.kind == Token::name && tok.text == "in"; });
      const std::vector<Token> iterated(in == rest.end() ? rest.end() : in + 1, rest.end());
      push(kw, !iterated.empty() && positive_tool_term(iterated));
    } else if (kw == "macro" || kw == "generation") {
      push(kw, false);
    } else if (kw == "endif" || kw == "endfor" || kw == "endmacro" || kw == "endgeneration") {
      const std::string opened = kw.substr(3);
      if (blocks_.empty() || blocks_.back().keyword != opened)
        throw RuntimeError("line " + std::to_string(line) + ": {% " + kw + " %} without its {% " + opened + " %}");
      const bool shown = !in_outer_tool() && blocks_.back().shown;
      set_back_tool(false);
      blocks_.pop_back();
      return shown;
    } else if (kw == "set") {
      if (std::none_of(rest.begin(), rest.end(), [](const Token& tok) { return tok.text == "="; }))
        scan_.unsupported.push_back("line " + std::to_string(line) + ": {% set ... %}...{% endset %}");
    } else if (kw != "break" && kw != "continue") {
      scan_.unsupported.push_back("line " + std::to_string(line) + ": {% " + kw + " %}");
    }
    return true;
  }

  // A name's feature: a filter ("|trim"), a method call (".strip()"), a loop / namespace
  // attribute ("loop.last"), or one of the globals that matter (bos_token, eos_token, strftime_now).
  void count_feature(const std::vector<Token>& toks, size_t i, bool call) {
    const Token& tok = toks[i];
    const std::string& prev = i > 0 ? toks[i - 1].text : "";
    const bool after_dot = i > 0 && toks[i - 1].kind == Token::other && prev == ".";
    if (i > 0 && toks[i - 1].kind == Token::other && prev == "|")
      ++scan_.features["|" + tok.text];
    else if (after_dot && call)
      ++scan_.features["." + tok.text + "()"];
    else if (after_dot && i >= 2 && (toks[i - 2].text == "loop" || toks[i - 2].text == "ns"))
      ++scan_.features[toks[i - 2].text + "." + tok.text];
    else if (!after_dot && (tok.text == "bos_token" || tok.text == "eos_token" || tok.text == "strftime_now"))
      ++scan_.features[tok.text];
  }

  // The tag's code from token `from` on, with its literals and features counted where `count`; a
  // raise_exception's message (which renders nothing) left out.
  void count_tokens(const std::vector<Token>& toks, size_t from, int line, TemplateScan::Tag& tag, bool count = true) {
    bool last_other = false;
    for (size_t i = from; i < toks.size(); ++i) {
      const Token& tok = toks[i];
      const bool call = i + 1 < toks.size() && toks[i + 1].text == "(";
      if (tok.kind == Token::name && tok.text == "raise_exception" && call) {
        tag.code.insert(tag.code.end(), {"raise_exception", "(", ")"});
        last_other = true;
        int depth = 0;
        for (++i; i < toks.size(); ++i) {
          if (toks[i].kind == Token::other && toks[i].text == "(") ++depth;
          if (toks[i].kind == Token::other && toks[i].text == ")" && --depth == 0) break;
        }
        continue;
      }
      append_code(tag.code, last_other, tok);
      if (!count) continue;
      if (tok.kind == Token::string)
        scan_.literals.push_back({tok.text, line});
      else if (tok.kind == Token::name)
        count_feature(toks, i, call);
    }
  }

  const std::string& t_;
  TemplateScan scan_;
  std::vector<Block> blocks_;
  size_t first_tool_ = SIZE_MAX;  // the outermost open tool branch (blocks only change at the back)
  size_t counted_ = 0;
  int lines_ = 1;
};

}  // namespace

TemplateScan scan_template(const std::string& t) { return Scanner(t).run(); }

}  // namespace ptrain
