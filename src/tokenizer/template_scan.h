// What a Jinja chat template is made of, as transformers' environment reads it (trim_blocks,
// lstrip_blocks, `-` whitespace control): its string literals, the text it outputs outside
// expressions, the filters, methods and token variables it uses — each marked as inside a
// tool-call branch or not — for recognizing a template by what it holds rather than by a few
// substrings (src/tokenizer/chat.cpp).
//
// Tool-call branches are those a chat without tools never enters, as transformers renders it (tools
// passed as none, no tool_calls, no tool messages): the body of an `{% if %}` / `{% elif %}` whose
// condition is false for every such chat — each top-level `or` alternative has an `and`-ed term of
// the forms `tools`, `tools is not none`, `custom_tools is defined`, `x.tool_calls`,
// `'tool_calls' in x`, `x.role == 'tool'` (template_scan.cpp lists them all) — and of a `{% for %}`
// over tools or tool calls; an `{% else %}` is never one. Nothing else is assumed about a name.
//
// `tags` is the template's logic as such a chat meets it: every tag outside tool branches, in
// order, as tokens — so two templates with equal tags render every chat without tools alike
// (neither renders text outside its tags; whitespace inside a tag and `-` control change nothing
// then). A tool branch goes with its `{% if %}` / `{% endif %}`: `{% if tools %}A{% else %}B{% endif %}`
// has B's tags, `{% if tools %}A{% elif c %}B{% endif %}` those of `{% if c %}B{% endif %}`.
#pragma once
#include <map>
#include <string>
#include <vector>

namespace ptrain {

struct TemplateScan {
  struct Literal {
    std::string text;  // unescaped
    int line = 0;
  };
  std::vector<Literal> literals;     // string literals outside tool branches and raise_exception(...)
  std::vector<Literal> output_text;  // text outside tags and tool branches that renders (after whitespace control)
  // Outside tool branches: "|NAME" for each filter, ".NAME()" for each method call, and each use
  // of bos_token, eos_token, strftime_now, loop.ATTR, ns.ATTR — with their counts.
  std::map<std::string, int> features;
  struct Tag {
    // "{{" or "{%", then names, operators ("==", "!=", "<=", ...), numbers, and string literals as
    // "'" + the unescaped text; raise_exception(...)'s message left out (it renders nothing).
    std::vector<std::string> code;
    std::string source;  // as written, whitespace runs as one space (for messages)
    int line = 0;
  };
  std::vector<Tag> tags;
  // Every tag, tool branches included, as tags are written (no branch folded into its `if`), and
  // the text tool branches render outside their tags: what a chat with tools meets, for
  // comparing a template's tool branches too (chat.cpp renders tools for one template).
  std::vector<Tag> every_tag;
  std::vector<Literal> tool_output_text;
  std::vector<std::string> unsupported;  // {% raw %}, {% call %}, {% set x %}...{% endset %}, ...: "line N: {% raw %}"
};

// Throws RuntimeError naming the line for an unterminated tag, comment or string literal.
TemplateScan scan_template(const std::string& text);

}  // namespace ptrain
