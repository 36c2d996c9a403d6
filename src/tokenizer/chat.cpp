#include "tokenizer/chat.h"

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <stdexcept>
#include <tuple>

#include "common/error.h"
#include "common/fs_util.h"
#include "common/json_value.h"
#include "common/python_json.h"
#include "common/utf8.h"
#include "tokenizer/template_scan.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// Python's str.isspace() for the code point UTF-8 encodes at s[i..i+n).
std::string template_options() {
  return " (set data.chat_template to one of llama3, llama3.1, llama3.2, qwen2.5, qwen3, chatml, mistral, "
         "mistral-system-first, mistral-v0.2, mistral-v0.1, mistral-nemo, mistral-tekken, devstral, deepseek-r1, qwq "
         "if your data was made for one of them)";
}

bool python_space(const std::string& s, size_t i, size_t& n) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[i + k]); };
  const unsigned char c = b(0);
  n = 1;
  if (c < 0x80) return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20);
  uint32_t cp = 0;
  if ((c & 0xE0) == 0xC0 && i + 1 < s.size()) {
    cp = ((c & 0x1Fu) << 6) | (b(1) & 0x3Fu);
    n = 2;
  } else if ((c & 0xF0) == 0xE0 && i + 2 < s.size()) {
    cp = ((c & 0x0Fu) << 12) | ((b(1) & 0x3Fu) << 6) | (b(2) & 0x3Fu);
    n = 3;
  } else {
    return false;
  }
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Jinja's `trim`: Python's str.strip(), which takes Unicode whitespace (U+00A0, U+3000, ...) too.
std::string trim(const std::string& s) {
  size_t b = 0, e = s.size(), n = 0;
  while (b < e && python_space(s, b, n)) b += n;
  while (e > b) {  // step back to the start of the last code point
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    if (!python_space(s, start, n) || start + n != e) break;
    e = start;
  }
  return s.substr(b, e - b);
}

constexpr const char* kQwenSystem = "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.";

// What a template renders, as pieces of text, each trained or not.
struct Part {
  std::string text;
  bool trained;
};

// The parts' ids, exactly as encoding their concatenation does: the text splits at the added
// tokens a part is exactly (those split any text cleanly); each stretch between them is encoded
// whole, and a part's ids are what it adds to the encoding of the stretch so far. Where a part
// re-tokenizes the end of the parts before it (GPT-2's regex joins a template's "\n" and the
// spaces a message starts with), the tokens from there on are replaced — allowed only where they
// are all trained, or all not, so that the mask needs no boundary inside a token.
Sample tokenize_parts(const Tokenizer& tok, const std::vector<Part>& parts, bool train_all) {
  Sample s;
  std::string stretch;
  std::vector<int32_t> so_far;
  size_t base = 0;       // where the stretch's ids begin in s.ids
  bool at_start = true;  // the stretch begins the text
  for (const Part& p : parts) {
    const bool trained = p.trained || train_all;
    if (auto id = tok.splitting_token(p.text)) {
      s.ids.push_back(*id);
      s.trained.push_back(trained);
      stretch.clear();
      so_far.clear();
      base = s.ids.size();
      at_start = false;
      continue;
    }
    stretch += p.text;
    const std::vector<int32_t> ids = tok.encode(stretch, at_start);
    const size_t same =
        static_cast<size_t>(std::mismatch(so_far.begin(), so_far.end(), ids.begin(), ids.end()).first - so_far.begin());
    if (std::any_of(s.trained.begin() + static_cast<std::ptrdiff_t>(base + same), s.trained.end(),
                    [&](uint8_t t) { return static_cast<bool>(t) != trained; }))
      throw RuntimeError("the tokenizer merges the start of \"" + p.text.substr(0, 40) +
                         "\" with the template text before it into one token, so no token boundary separates what is "
                         "trained from what is not");
    s.ids.resize(base + same);
    s.trained.resize(base + same);
    s.ids.insert(s.ids.end(), ids.begin() + static_cast<std::ptrdiff_t>(same), ids.end());
    s.trained.insert(s.trained.end(), ids.size() - same, trained);
    so_far = ids;
  }
  return s;
}

// The directory's default chat template, as transformers picks it: additional_chat_templates/
// default.jinja, else chat_template.jinja, else tokenizer_config.json's chat_template (a string,
// or a list of named templates: "default") — unless additional_chat_templates/ holds named
// templates, which then leave transformers without a default.
std::string template_text(const fs::path& dir, std::string& where) {
  const fs::path extra = dir / "additional_chat_templates";
  for (const fs::path& p : {extra / "default.jinja", dir / "chat_template.jinja"})
    if (fs::is_regular_file(p)) {
      where = p.string();
      return read_text_file(where);
    }
  if (fs::is_directory(extra))
    for (const auto& e : fs::directory_iterator(extra))
      if (e.path().extension() == ".jinja")
        throw RuntimeError(extra.string() + " holds named chat templates (" + e.path().filename().string() + ") and " +
                           dir.string() +
                           " has no chat_template.jinja: transformers then has no default template and renders "
                           "none without a name; name the template in data.chat_template");
  const fs::path cfg = dir / "tokenizer_config.json";
  if (!fs::is_regular_file(cfg)) return "";
  where = cfg.string();
  const nlohmann::json j = read_json_file(where);
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

// The templates ptrain renders, as their models ship them (tool-call branches aside: a chat
// without tools never enters them; those marked `tools` are the releases whose tool branches
// ptrain renders too, and a template's tool branches must be theirs, every tag, for a chat with
// tools to render with it: tool_difference). A directory's template is recognized as one of these when it renders no
// text outside its tags and has the same tags in the same order outside tool branches (TemplateScan::tags: every
// operator, name and literal but raise_exception's message); anything else is refused, naming the first difference — in
// its string literals, filters, methods, token variables or loop / namespace attributes (counted), else the first tag
// that differs (an edit of logic alone: `!=` for `==`, a moved slice bound). ChatML's default system message
// ("<|im_start|>system\n...<|im_end|>\n") and the one a template sets default_system_message to (Devstral's) may be any
// text: it is read from the template and rendered when a chat has no system message.
struct KnownTemplate {
  ChatTemplate kind;
  const char* model;
  std::string text;
  std::string think_prompt = {};  // deepseek-r1 / qwq: what its generation prompt adds after the assistant header
  bool tools = false;             // ptrain renders its tool branches too (chat_parts)
};

// Qwen2.5 Instruct's template as released (Qwen2.5-7B-Instruct's tokenizer_config.json), tool
// branches and all: its tools, tool calls and tool results render too.
constexpr const char* kQwen25Released = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are Qwen, created by Alibaba Cloud. You are a helpful assistant.' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
    {%- else %}
        {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant" and not message.tool_calls) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)";

// Qwen3's template as first released (Qwen3-0.6B's tokenizer_config.json), tool branches and all:
// its tools, tool calls and tool results render too.
constexpr const char* kQwen3FirstRelease = R"({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0].role == 'system' %}
        {{- messages[0].content + '\n\n' }}
    {%- endif %}
    {{- "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0].role == 'system' %}
        {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
    {%- endif %}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is defined and message.reasoning_content is not none %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in message.content %}
                {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
                {%- set reasoning_content = message.content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {%- if message.tool_calls %}
            {%- for tool_call in message.tool_calls %}
                {%- if (loop.first and content) or (not loop.first) %}
                    {{- '\n' }}
                {%- endif %}
                {%- if tool_call.function %}
                    {%- set tool_call = tool_call.function %}
                {%- endif %}
                {{- '<tool_call>\n{"name": "' }}
                {{- tool_call.name }}
                {{- '", "arguments": ' }}
                {%- if tool_call.arguments is string %}
                    {{- tool_call.arguments }}
                {%- else %}
                    {{- tool_call.arguments | tojson }}
                {%- endif %}
                {{- '}\n</tool_call>' }}
            {%- endfor %}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if loop.first or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)";

// Llama 3.1 Instruct's template as released (Llama 3.1 8B's and Llama 3.3 70B's
// tokenizer_config.json, the same text), tool branches and all: its tools, tool calls and tool
// results render too (with builtin_tools undefined, as apply_chat_template leaves it).
constexpr const char* kLlama31Released = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message + builtin tools #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if builtin_tools is defined or tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{%- if builtin_tools is defined %}
    {{- "Tools: " + builtin_tools | reject('equalto', 'code_interpreter') | join(", ") + "\n\n"}}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {%- if builtin_tools is defined and tool_call.name in builtin_tools %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- "<|python_tag|>" + tool_call.name + ".call(" }}
            {%- for arg_name, arg_val in tool_call.arguments | items %}
                {{- arg_name + '="' + arg_val + '"' }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- endif %}
                {%- endfor %}
            {{- ")" }}
        {%- else  %}
            {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
            {{- '{"name": "' + tool_call.name + '", ' }}
            {{- '"parameters": ' }}
            {{- tool_call.arguments | tojson }}
            {{- "}" }}
        {%- endif %}
        {%- if builtin_tools is defined %}
            {#- This means we're in ipython mode #}
            {{- "<|eom_id|>" }}
        {%- else %}
            {{- "<|eot_id|>" }}
        {%- endif %}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

// Llama 3.2 Instruct's template as released (Llama 3.2 3B's): 3.1's with today's date and without
// builtin_tools.
constexpr const char* kLlama32Released = R"TPL({{- bos_token }}
{%- if custom_tools is defined %}
    {%- set tools = custom_tools %}
{%- endif %}
{%- if not tools_in_user_message is defined %}
    {%- set tools_in_user_message = true %}
{%- endif %}
{%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}

{#- This block extracts the system message, so we can slot it into the right place. #}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}

{#- System message #}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{%- if tools is not none %}
    {{- "Environment: ipython\n" }}
{%- endif %}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{%- if tools is not none and not tools_in_user_message %}
    {{- "You have access to the following functions. To call a function, please respond with JSON for a function call." }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
{%- endif %}
{{- system_message }}
{{- "<|eot_id|>" }}

{#- Custom tools are passed in a user message with some extra guidance #}
{%- if tools_in_user_message and not tools is none %}
    {#- Extract the first user message so we can plug it in here #}
    {%- if messages | length != 0 %}
        {%- set first_user_message = messages[0]['content']|trim %}
        {%- set messages = messages[1:] %}
    {%- else %}
        {{- raise_exception("Cannot put tools in the first user message when there's no first user message!") }}
{%- endif %}
    {{- '<|start_header_id|>user<|end_header_id|>\n\n' -}}
    {{- "Given the following functions, please respond with a JSON for a function call " }}
    {{- "with its proper arguments that best answers the given prompt.\n\n" }}
    {{- 'Respond in the format {"name": function name, "parameters": dictionary of argument name and its value}.' }}
    {{- "Do not use variables.\n\n" }}
    {%- for t in tools %}
        {{- t | tojson(indent=4) }}
        {{- "\n\n" }}
    {%- endfor %}
    {{- first_user_message + "<|eot_id|>"}}
{%- endif %}

{%- for message in messages %}
    {%- if not (message.role == 'ipython' or message.role == 'tool' or 'tool_calls' in message) %}
        {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
    {%- elif 'tool_calls' in message %}
        {%- if not message.tool_calls|length == 1 %}
            {{- raise_exception("This model only supports single tool-calls at once!") }}
        {%- endif %}
        {%- set tool_call = message.tool_calls[0].function %}
        {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' -}}
        {{- '{"name": "' + tool_call.name + '", ' }}
        {{- '"parameters": ' }}
        {{- tool_call.arguments | tojson }}
        {{- "}" }}
        {{- "<|eot_id|>" }}
    {%- elif message.role == "tool" or message.role == "ipython" %}
        {{- "<|start_header_id|>ipython<|end_header_id|>\n\n" }}
        {%- if message.content is mapping or message.content is iterable %}
            {{- message.content | tojson }}
        {%- else %}
            {{- message.content }}
        {%- endif %}
        {{- "<|eot_id|>" }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)TPL";

constexpr const char* kDefaultSystemSlot = "<|im_start|>system\n\x01<|im_end|>\n";
constexpr const char* kNamedSystemSlot =
    "\x01"
    "default_system_message";

using Edits = std::vector<std::pair<std::string, std::string>>;

// `text` with the first occurrence of each edit's text replaced (one not found is a bug in
// known_templates()).
std::string edited(std::string text, const Edits& edits, const char* model) {
  for (const auto& [from, to] : edits) {
    const size_t at = text.find(from);
    if (at == std::string::npos)
      throw std::logic_error(std::string("known_templates: an edit for ") + model + " not found");
    text.replace(at, from.size(), to);
  }
  return text;
}

const std::vector<KnownTemplate>& known_templates() {
  static const std::vector<KnownTemplate> known{
      {ChatTemplate::llama3, "Llama 3 Instruct",
       R"({% set loop_messages = messages %}{% for message in loop_messages %}{% set content = '<|start_header_id|>' + message['role'] + '<|end_header_id|>

'+ message['content'] | trim + '<|eot_id|>' %}{% if loop.index0 == 0 %}{% set content = bos_token + content %}{% endif %}{{ content }}{% endfor %}{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>

' }}{% endif %})"},
      {ChatTemplate::llama3_1, "Llama 3.1 Instruct", R"({{- bos_token }}
{%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %}
{%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content']|trim %}
    {%- set messages = messages[1:] %}
{%- else %}
    {%- set system_message = "" %}
{%- endif %}
{{- "<|start_header_id|>system<|end_header_id|>\n\n" }}
{{- "Cutting Knowledge Date: December 2023\n" }}
{{- "Today Date: " + date_string + "\n\n" }}
{{- system_message }}
{{- "<|eot_id|>" }}
{%- for message in messages %}
    {{- '<|start_header_id|>' + message['role'] + '<|end_header_id|>\n\n'+ message['content'] | trim + '<|eot_id|>' }}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|start_header_id|>assistant<|end_header_id|>\n\n' }}
{%- endif %}
)"},
      {ChatTemplate::qwen2_5, "Qwen2 / Qwen1.5 Instruct",
       R"({% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system
You are a helpful assistant.<|im_end|>
' }}{% endif %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})"},
      {ChatTemplate::qwen2_5, "Qwen2.5 Instruct", R"({%- if messages[0]['role'] == 'system' %}
    {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
{%- else %}
    {{- '<|im_start|>system\nYou are Qwen, created by Alibaba Cloud. You are a helpful assistant.<|im_end|>\n' }}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) or (message.role == "assistant") %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
{%- endif %}
)"},
      {ChatTemplate::qwen3, "Qwen3", R"({%- if messages[0].role == 'system' %}
    {{- '<|im_start|>system\n' + messages[0].content + '<|im_end|>\n' }}
{%- endif %}
{%- set ns = namespace(multi_step_tool=true, last_query_index=messages|length - 1) %}
{%- for message in messages[::-1] %}
    {%- set index = (messages|length - 1) - loop.index0 %}
    {%- if ns.multi_step_tool and message.role == "user" and message.content is string and not(message.content.startswith('<tool_response>') and message.content.endswith('</tool_response>')) %}
        {%- set ns.multi_step_tool = false %}
        {%- set ns.last_query_index = index %}
    {%- endif %}
{%- endfor %}
{%- for message in messages %}
    {%- if message.content is string %}
        {%- set content = message.content %}
    {%- else %}
        {%- set content = '' %}
    {%- endif %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set reasoning_content = '' %}
        {%- if message.reasoning_content is string %}
            {%- set reasoning_content = message.reasoning_content %}
        {%- else %}
            {%- if '</think>' in content %}
                {%- set reasoning_content = content.split('</think>')[0].rstrip('\n').split('<think>')[-1].lstrip('\n') %}
                {%- set content = content.split('</think>')[-1].lstrip('\n') %}
            {%- endif %}
        {%- endif %}
        {%- if loop.index0 > ns.last_query_index %}
            {%- if loop.last or (not loop.last and reasoning_content) %}
                {{- '<|im_start|>' + message.role + '\n<think>\n' + reasoning_content.strip('\n') + '\n</think>\n\n' + content.lstrip('\n') }}
            {%- else %}
                {{- '<|im_start|>' + message.role + '\n' + content }}
            {%- endif %}
        {%- else %}
            {{- '<|im_start|>' + message.role + '\n' + content }}
        {%- endif %}
        {{- '<|im_end|>\n' }}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\n\n</think>\n\n' }}
    {%- endif %}
{%- endif %}
)"},
      {ChatTemplate::chatml, "ChatML",
       R"({% for message in messages %}{{'<|im_start|>' + message['role'] + '
' + message['content'] + '<|im_end|>' + '
'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant
' }}{% endif %})"},
      {ChatTemplate::mistral, "Mistral v0.3", R"({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %}
        {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
    {%- endif %}
{%- endfor %}
{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST] " + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST] " + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif message["role"] == "assistant" %}
        {{- " " + message["content"]|trim + eos_token}}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)"},
      {ChatTemplate::mistral_v0_2, "Mistral 7B Instruct v0.2", R"({%- if messages[0]['role'] == 'system' %}
    {%- set system_message = messages[0]['content'] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}
        {{- raise_exception('After the optional system message, conversation roles must alternate user/assistant/user/assistant/...') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- if loop.first and system_message is defined %}
            {{- ' [INST] ' + system_message + '\n\n' + message['content'] + ' [/INST]' }}
        {%- else %}
            {{- ' [INST] ' + message['content'] + ' [/INST]' }}
        {%- endif %}
    {%- elif message['role'] == 'assistant' %}
        {{- ' ' + message['content'] + eos_token}}
    {%- else %}
        {{- raise_exception('Only user and assistant roles are supported, with the exception of an initial optional system message!') }}
    {%- endif %}
{%- endfor %}
)"},
      {ChatTemplate::mistral_v0_1, "Mistral 7B Instruct v0.1",
       "{{ bos_token }}{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}{{ "
       "raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}{% endif %}{% if "
       "message['role'] == 'user' %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% elif message['role'] == "
       "'assistant' %}{{ message['content'] + eos_token + ' ' }}{% else %}{{ raise_exception('Only user and assistant "
       "roles are supported!') }}{% endif %}{% endfor %}"},
      // A message whose content is none is a tool call's (template_scan.cpp): that branch does not count.
      {ChatTemplate::mistral_nemo, "Mistral Nemo Instruct 2407", R"TPL({%- if messages[0]["role"] == "system" %}
    {%- set system_message = messages[0]["content"] %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set loop_messages = messages %}
{%- endif %}
{%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}

{#- This block checks for alternating user/assistant messages, skipping tool calling messages #}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
        {%- if (message["role"] == "user") != (ns.index % 2 == 0) %}
            {{- raise_exception("After the optional system message, conversation roles must alternate user/assistant/user/assistant/...") }}
        {%- endif %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}

{{- bos_token }}
{%- for message in loop_messages %}
    {%- if message["role"] == "user" %}
        {%- if tools is not none and (message == user_messages[-1]) %}
            {{- "[AVAILABLE_TOOLS][" }}
            {%- for tool in tools %}
                {%- set tool = tool.function %}
                {{- '{"type": "function", "function": {' }}
                {%- for key, val in tool.items() if key != "return" %}
                    {%- if val is string %}
                        {{- '"' + key + '": "' + val + '"' }}
                    {%- else %}
                        {{- '"' + key + '": ' + val|tojson }}
                    {%- endif %}
                    {%- if not loop.last %}
                        {{- ", " }}
                    {%- endif %}
                {%- endfor %}
                {{- "}}" }}
                {%- if not loop.last %}
                    {{- ", " }}
                {%- else %}
                    {{- "]" }}
                {%- endif %}
            {%- endfor %}
            {{- "[/AVAILABLE_TOOLS]" }}
            {%- endif %}
        {%- if loop.last and system_message is defined %}
            {{- "[INST]" + system_message + "\n\n" + message["content"] + "[/INST]" }}
        {%- else %}
            {{- "[INST]" + message["content"] + "[/INST]" }}
        {%- endif %}
    {%- elif (message.tool_calls is defined and message.tool_calls is not none) %}
        {{- "[TOOL_CALLS][" }}
        {%- for tool_call in message.tool_calls %}
            {%- set out = tool_call.function|tojson %}
            {{- out[:-1] }}
            {%- if not tool_call.id is defined or tool_call.id|length != 9 %}
                {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
            {%- endif %}
            {{- ', "id": "' + tool_call.id + '"}' }}
            {%- if not loop.last %}
                {{- ", " }}
            {%- else %}
                {{- "]" + eos_token }}
            {%- endif %}
        {%- endfor %}
    {%- elif message["role"] == "assistant" %}
        {{- message["content"] + eos_token}}
    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- '[TOOL_RESULTS]{"content": ' + content|string + ", " }}
        {%- if not message.tool_call_id is defined or message.tool_call_id|length != 9 %}
            {{- raise_exception("Tool call IDs should be alphanumeric strings with length 9!") }}
        {%- endif %}
        {{- '"call_id": "' + message.tool_call_id + '"}[/TOOL_RESULTS]' }}
    {%- else %}
        {{- raise_exception("Only user and assistant roles are supported, with the exception of an initial optional system message!") }}
    {%- endif %}
{%- endfor %}
)TPL",
       "", true},
      // QwQ-32B's as llama.cpp keeps it: its generation prompt closes the reasoning unless enable_thinking is passed.
      // Unsloth's release of Devstral Small 2507's, as llama.cpp keeps it (its default system message
      // is devstral_system()).
      {ChatTemplate::devstral, "Devstral Small 2507 (Unsloth's)",
       R"TPL({#- Copyright 2025-present the Unsloth team. All rights reserved. #}
{#- Licensed under the Apache License, Version 2.0 (the "License") #}
{#- Edits made by Unsloth #}
{%- set default_system_message = 'You are Devstral, a helpful agentic model trained by Mistral AI and using the OpenHands scaffold. You can interact with a computer to solve tasks.\n\n<ROLE>\nYour primary role is to assist users by executing commands, modifying code, and solving technical problems effectively. You should be thorough, methodical, and prioritize quality over speed.\n* If the user asks a question, like \"why is X happening\", don\'t try to fix the problem. Just give an answer to the question.\n</ROLE>\n\n<EFFICIENCY>\n* Each action you take is somewhat expensive. Wherever possible, combine multiple actions into a single action, e.g. combine multiple bash commands into one, using sed and grep to edit/view multiple files at once.\n* When exploring the codebase, use efficient tools like find, grep, and git commands with appropriate filters to minimize unnecessary operations.\n</EFFICIENCY>\n\n<FILE_SYSTEM_GUIDELINES>\n* When a user provides a file path, do NOT assume it\'s relative to the current working directory. First explore the file system to locate the file before working on it.\n* If asked to edit a file, edit the file directly, rather than creating a new file with a different filename.\n* For global search-and-replace operations, consider using `sed` instead of opening file editors multiple times.\n</FILE_SYSTEM_GUIDELINES>\n\n<CODE_QUALITY>\n* Write clean, efficient code with minimal comments. Avoid redundancy in comments: Do not repeat information that can be easily inferred from the code itself.\n* When implementing solutions, focus on making the minimal changes needed to solve the problem.\n* Before implementing any changes, first thoroughly understand the codebase through exploration.\n* If you are adding a lot of code to a function or file, consider splitting the function or file into smaller pieces when appropriate.\n</CODE_QUALITY>\n\n<VERSION_CONTROL>\n* When configuring git credentials, use \"openhands\" as the user.name and \"openhands@all-hands.dev\" as the user.email by default, unless explicitly instructed otherwise.\n* Exercise caution with git operations. Do NOT make potentially dangerous changes (e.g., pushing to main, deleting repositories) unless explicitly asked to do so.\n* When committing changes, use `git status` to see all modified files, and stage all files necessary for the commit. Use `git commit -a` whenever possible.\n* Do NOT commit files that typically shouldn\'t go into version control (e.g., node_modules/, .env files, build directories, cache files, large binaries) unless explicitly instructed by the user.\n* If unsure about committing certain files, check for the presence of .gitignore files or ask the user for clarification.\n</VERSION_CONTROL>\n\n<PULL_REQUESTS>\n* When creating pull requests, create only ONE per session/issue unless explicitly instructed otherwise.\n* When working with an existing PR, update it with new commits rather than creating additional PRs for the same issue.\n* When updating a PR, preserve the original PR title and purpose, updating description only when necessary.\n</PULL_REQUESTS>\n\n<PROBLEM_SOLVING_WORKFLOW>\n1. EXPLORATION: Thoroughly explore relevant files and understand the context before proposing solutions\n2. ANALYSIS: Consider multiple approaches and select the most promising one\n3. TESTING:\n   * For bug fixes: Create tests to verify issues before implementing fixes\n   * For new features: Consider test-driven development when appropriate\n   * If the repository lacks testing infrastructure and implementing tests would require extensive setup, consult with the user before investing time in building testing infrastructure\n   * If the environment is not set up to run tests, consult with the user first before investing time to install all dependencies\n4. IMPLEMENTATION: Make focused, minimal changes to address the problem\n5. VERIFICATION: If the environment is set up to run tests, test your implementation thoroughly, including edge cases. If the environment is not set up to run tests, consult with the user first before investing time to run tests.\n</PROBLEM_SOLVING_WORKFLOW>\n\n<SECURITY>\n* Only use GITHUB_TOKEN and other credentials in ways the user has explicitly requested and would expect.\n* Use APIs to work with GitHub or other platforms, unless the user asks otherwise or your task requires browsing.\n</SECURITY>\n\n<ENVIRONMENT_SETUP>\n* When user asks you to run an application, don\'t stop if the application is not installed. Instead, please install the application and run the command again.\n* If you encounter missing dependencies:\n  1. First, look around in the repository for existing dependency files (requirements.txt, pyproject.toml, package.json, Gemfile, etc.)\n  2. If dependency files exist, use them to install all dependencies at once (e.g., `pip install -r requirements.txt`, `npm install`, etc.)\n  3. Only install individual packages directly if no dependency files are found or if only specific packages are needed\n* Similarly, if you encounter missing dependencies for essential tools requested by the user, install them when possible.\n</ENVIRONMENT_SETUP>\n\n<TROUBLESHOOTING>\n* If you\'ve made repeated attempts to solve a problem but tests still fail or the user reports it\'s still broken:\n  1. Step back and reflect on 5-7 different possible sources of the problem\n  2. Assess the likelihood of each possible cause\n  3. Methodically address the most likely causes, starting with the highest probability\n  4. Document your reasoning process\n* When you run into any major issue while executing a plan from the user, please don\'t try to directly work around it. Instead, propose a new plan and confirm with the user before proceeding.\n</TROUBLESHOOTING>' %}

{{- bos_token }}

{%- if messages[0]['role'] == 'system' %}
    {%- if messages[0]['content'] is string %}
        {%- set system_message = messages[0]['content'] %}
    {%- else %}
        {%- set system_message = messages[0]['content'][0]['text'] %}
    {%- endif %}
    {%- set loop_messages = messages[1:] %}
{%- else %}
    {%- set system_message = default_system_message %}
    {%- set loop_messages = messages %}
{%- endif %}
{{- '[SYSTEM_PROMPT]' + system_message + '[/SYSTEM_PROMPT]' }}


{#- Tool description appended ONLY to last user message. Edits made by Unsloth #}
{#- Tool description appended also if last message is tool. Edits made by Unsloth #}
{%- set tools_description = "" %}
{%- set has_tools = false %}

{%- if tools is defined and tools is not none and tools|length > 0 %}

    {%- set has_tools = true %}
    {%- set tools_description = "[AVAILABLE_TOOLS]" + (tools | tojson) + "[/AVAILABLE_TOOLS]" %}

    {{- tools_description }}

{%- endif %}

{%- for message in loop_messages %}
    {%- if message['role'] == 'user' %}

        {%- if message['content'] is string %}
            {{- '[INST]' + message['content'] + '[/INST]' }}
        {%- else %}
            {{- '[INST]' }}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}

                    {#- Original did not have content which is weird. Added by Un-sloth. #}
                    {%- if block['text'] is defined %}
                        {{- block['text'] }}
                    {%- else %}
                        {{- block['content'] }}
                    {%- endif %}

                {%- elif block['type'] in ['image', 'image_url'] %}
                    {{- '[IMG]' }}
                {%- else %}
                    {{- raise_exception('Only text and image blocks are supported in message content!') }}
                {%- endif %}
            {%- endfor %}
            {{- '[/INST]' }}
        {%- endif %}

    {%- elif message['role'] == 'system' %}
        {%- if message['content'] is string %}
            {{- '[SYSTEM_PROMPT]' + message['content'] + '[/SYSTEM_PROMPT]' }}
        {%- else %}
            {{- '[SYSTEM_PROMPT]' + message['content'][0]['text'] + '[/SYSTEM_PROMPT]' }}
        {%- endif %}
        

    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is string %}
            {{- message['content'] }}
        {%- else %}
            {{- message['content'][0]['text'] }}
        {%- endif %}

        {#- If User,Assistant,Tool,Tool we also need to append tools_description. Edits made by Unsloth #}

        {%- if message['tool_calls'] is defined and message['tool_calls'] is not none %}
            {%- for tool in message['tool_calls'] %}
                {%- set arguments = tool['function']['arguments'] %}
                {%- if arguments is not string %}
                    {%- set arguments = arguments|tojson %}
                {%- endif %}
                {#- Must list tool calls AFTER assistant. Edits made by Un-sloth #}
                {{- "[TOOL_CALLS]" + tool['function']['name'] + "[ARGS]" + arguments }}
            {%- endfor %}
        {%- endif %}

        {{- eos_token }}

    {%- elif message["role"] == "tool_results" or message["role"] == "tool" %}
        {%- if message.content is defined and message.content.content is defined %}
            {%- set content = message.content.content %}
        {%- else %}
            {%- set content = message.content %}
        {%- endif %}
        {{- "[TOOL_RESULTS]" + content|string + "[/TOOL_RESULTS]" }}

    {%- else %}
        {{- raise_exception('Only user, systemm assistant and tool roles are supported in the custom template made by Unsloth!') }}
    {%- endif %}
{%- endfor %}
{#- Copyright 2025-present the Unsloth team. All rights reserved. #}
{#- Licensed under the Apache License, Version 2.0 (the "License") #})TPL"},
      // mistral-common 1.13.1's for a Tekken v3 vocabulary (Mistral Nemo's): what transformers attaches when it
      // converts a tekken.json (convert_tekken_tokenizer).
      {ChatTemplate::mistral_tekken, "mistral-common's Tekken v3 template",
       R"TPL({#- Default system message if no system prompt is passed. #}
{%- set default_system_message = '' %}

{#- Begin of sequence token. #}
{{- bos_token }}


{#- Handle system prompt if it exists. #}
{#- Extract all system messages and merge into system prompt. #}
{%- set ns_sys = namespace(system_parts=[], filtered=[]) %}
{%- for message in messages %}
    {%- if message['role'] == 'system' %}
        {%- if message['content'] is string %}
            {%- set ns_sys.system_parts = ns_sys.system_parts + [message['content']] %}
        {%- else %}
            {%- for block in message['content'] %}
                {%- if block['type'] == 'text' %}
                    {%- set ns_sys.system_parts = ns_sys.system_parts + [block['text']] %}
                {%- else %}
                    {{- raise_exception('Only text chunks are supported in system message content.') }}
                {%- endif %}
            {%- endfor %}
        {%- endif %}
    {%- else %}
        {%- set ns_sys.filtered = ns_sys.filtered + [message] %}
    {%- endif %}
{%- endfor %}
{%- if ns_sys.system_parts | length > 0 %}
    {%- set system_message = ns_sys.system_parts | join('\n\n') %}
{%- else %}
    {%- set system_message = default_system_message %}
{%- endif %}
{%- set loop_messages = ns_sys.filtered %}


{#- Tools definition #}
{%- set available_tools = '' %}
{%- set has_tools = false %}
{%- if tools is defined and tools is not none and tools|length > 0 %}
    {%- set has_tools = true %}
    {%- set available_tools = '[AVAILABLE_TOOLS]' ~ (tools| tojson) ~ '[/AVAILABLE_TOOLS]' %}
{%- endif %}

{#- Macros #}
{%- macro render_content(content, context_name) -%}
    {%- if content is string -%}
        {{- content -}}
    {%- elif content -%}
        {%- for block in content -%}
            {%- if block['type'] == 'text' -%}
                {{- block['text'] -}}
            {%- else -%}
                {{- raise_exception('Only text chunks are supported in ' ~ context_name ~ '.') -}}
            {%- endif -%}
        {%- endfor -%}
    {%- else -%}
        {{- raise_exception(context_name ~ ' must have non-empty content.') -}}
    {%- endif -%}
{%- endmacro -%}

{#- Aggregate consecutive messages with the same role except system and tool. #}
{#- A sentinel message is appended so the last group gets flushed inside the loop. #}
{%- set ns_agg = namespace(messages=[], current_group=[], current_role=none) %}
{%- for message in loop_messages + [{'role': '__sentinel__'}] %}
    {%- if message['role'] != ns_agg.current_role or message['role'] == 'system' or message['role'] == 'tool' %}
        {%- if ns_agg.current_role == 'tool' %}
            {%- set ns_agg.messages = ns_agg.messages + ns_agg.current_group %}
        {%- elif ns_agg.current_role is not none %}
            {%- set ns_c = namespace(text_parts=[], chunks=[], has_non_text=false, tool_calls=[]) %}
            {%- for msg in ns_agg.current_group %}
                {%- if msg['content'] is string %}
                    {%- set ns_c.text_parts = ns_c.text_parts + [msg['content']] %}
                {%- elif msg['content'] is not none %}
                    {%- for block in msg['content'] %}
                        {%- if block['type'] == 'text' %}
                            {%- set ns_c.text_parts = ns_c.text_parts + [block['text']] %}
                        {%- else %}
                            {%- if ns_c.text_parts | length > 0 %}
                                {%- set ns_c.chunks = ns_c.chunks + [{'type': 'text', 'text': ns_c.text_parts | join('\n\n')}] %}
                                {%- set ns_c.text_parts = [] %}
                            {%- endif %}
                            {%- set ns_c.chunks = ns_c.chunks + [block] %}
                            {%- set ns_c.has_non_text = true %}
                        {%- endif %}
                    {%- endfor %}
                {%- endif %}
                {%- if msg['tool_calls'] is defined and msg['tool_calls'] is not none %}
                    {%- set ns_c.tool_calls = ns_c.tool_calls + msg['tool_calls'] | list %}
                {%- endif %}
            {%- endfor %}
            {%- if ns_c.has_non_text %}
                {%- if ns_c.text_parts | length > 0 %}
                    {%- set ns_c.chunks = ns_c.chunks + [{'type': 'text', 'text': ns_c.text_parts | join('\n\n')}] %}
                {%- endif %}
                {%- set merged_content = ns_c.chunks %}
            {%- else %}
                {%- set merged_content = ns_c.text_parts | join('\n\n') %}
            {%- endif %}
            {%- if ns_c.tool_calls | length > 0 %}
                {%- set ns_agg.messages = ns_agg.messages + [{'role': ns_agg.current_role, 'content': merged_content, 'tool_calls': ns_c.tool_calls}] %}
            {%- else %}
                {%- set ns_agg.messages = ns_agg.messages + [{'role': ns_agg.current_role, 'content': merged_content}] %}
            {%- endif %}
        {%- endif %}
        {%- if message['role'] != '__sentinel__' %}
            {%- set ns_agg.current_group = [message] %}
            {%- set ns_agg.current_role = message['role'] %}
        {%- endif %}
    {%- else %}
        {%- set ns_agg.current_group = ns_agg.current_group + [message] %}
    {%- endif %}
{%- endfor %}
{%- set loop_messages = ns_agg.messages %}

{#- Validates message ordering. #}
{%- set ns = namespace(max_idx_user=-1) %}
{%- if loop_messages | length > 0 and loop_messages[0]['role'] != 'user' %}
    {{- raise_exception('Conversation must start with a user message, got ' ~ loop_messages[0]['role'] ~ '.') }}
{%- endif %}
{%- set ns_order = namespace(previous_role=none) %}
{%- for message in loop_messages %}
    {%- set current_role = message['role'] %}
    {%- if ns_order.previous_role is not none %}
        {%- if ns_order.previous_role == 'user' %}
            {%- if current_role not in ['assistant', 'user'] %}
                {{- raise_exception('Unexpected role \'' ~ current_role ~ '\' after role \'' ~ ns_order.previous_role ~ '\'') }}
            {%- endif %}
        {%- elif ns_order.previous_role == 'assistant' %}
            {%- if current_role not in ['assistant', 'user', 'tool'] %}
                {{- raise_exception('Unexpected role \'' ~ current_role ~ '\' after role \'' ~ ns_order.previous_role ~ '\'') }}
            {%- endif %}
        {%- elif ns_order.previous_role == 'tool' %}
            {%- if current_role not in ['assistant', 'tool', 'user'] %}
                {{- raise_exception('Unexpected role \'' ~ current_role ~ '\' after role \'' ~ ns_order.previous_role ~ '\'') }}
            {%- endif %}
        {%- endif %}
    {%- endif %}
    {%- if message.role == 'user' %}
        {%- set ns.max_idx_user = ns.max_idx_user + 1 %}
    {%- endif %}
    {%- set ns_order.previous_role = current_role %}
{%- endfor %}


{%- set ns.index = 0 %}
{#- Handle conversation messages. #}
{%- for message in loop_messages %}
    {#- User messages supports text content. #}
    {%- if message['role'] == 'user' %}
        {%- if (ns.index == ns.max_idx_user) and has_tools %}
            {{- available_tools }}
        {%- endif %}
        {{- '[INST]' }}
        {%- if (ns.index == ns.max_idx_user) and system_message != '' %}
            {{- system_message ~ '\n\n' }}
        {%- endif %}
        {%- if message['content'] is string %}
            {{- render_content(content=message['content'], context_name='user message content') -}}
        {%- elif message['content'] | length > 0 %}
            {{- render_content(content=message['content'], context_name='user message content') -}}
        {%- else %}
            {{- raise_exception('User message must have a string or a list of chunks in content') }}
        {%- endif %}
        {{- '[/INST]' }}

    {#- Assistant messages supports text content. #}
    {%- elif message['role'] == 'assistant' %}
        {%- if message['content'] is not none and message['content'] | length > 0 and message['tool_calls'] is defined and message['tool_calls'] is not none and message['tool_calls']|length > 0 %}
            {{- raise_exception('Assistant message cannot have both content and tool calls.') }}
        {%- endif %}

        {%- if (message['content'] is none or message['content'] == '' or message['content']|length == 0) and (message['tool_calls'] is not defined or message['tool_calls'] is none or message['tool_calls']|length == 0) %}
            {{- raise_exception('Assistant message must have a string or a list of chunks in content or a list of tool calls.') }}
        {%- endif %}

        {%- if message['content'] %}
            {{- render_content(content=message['content'], context_name='assistant message contents') -}}
        {%- endif %}

        {%- if message['tool_calls'] is defined and message['tool_calls'] is not none and message['tool_calls']|length > 0 %}
            {{- '[TOOL_CALLS][' }}
            {%- for tool in message['tool_calls'] %}
                {%- set name = tool['function']['name'] %}
                {%- set arguments = tool['function']['arguments'] %}
                {%- set id = tool['id']%}
                {%- if id is not defined or id|length != 9 %}
                    {{- raise_exception('Tool call must have an id of 9 characters or numbers.') }}
                {%- endif %}
                {%- if arguments is not string %}
                    {%- set arguments = arguments|tojson|safe %}
                {%- elif arguments == '' %}
                    {%- set arguments = '{}' %}
                {%- endif %}
                {{- '{"name": "' ~ name ~ '", "arguments": ' ~ arguments ~ ', "id": "' ~ id ~ '"}' }}
                {%- if loop.length > 1 and loop.index < loop.length %}
                    {{- ', ' }}
                {%- endif %}
            {%- endfor %}
            {{- ']' }}
        {%- endif %}

        {{- eos_token }}

    {#- Tool messages only supports text content. #}
    {%- elif message['role'] == 'tool' %}
        {# Try to parse 'content' as int or float if possible #}
        {%- set tool_content = message['content']|string %}
        {# Try to parse as int #}
        {%- set parsed_int = message['content']|int %}
        {% if parsed_int|string == message['content'] %}
            {%- set tool_content = parsed_int %}
        {# If int fails, try to parse as float #}
        {%- else %}
            {%- set parsed_float = message['content']|float %}
            {%- if parsed_float|string == message['content'] %}
                {%- set tool_content = parsed_float %}
            {%- endif %}
        {%- endif %}
        
        {%- if message['call_id'] is not undefined and message['call_id']|length == 9 %}
            {%- set tool_id = message['call_id'] %}
        {%- elif message['tool_call_id'] is not undefined and message['tool_call_id']|length == 9  %}
            {%- set tool_id = message['tool_call_id'] %}
        {%- else %}
            {{- raise_exception('Tool message must have a call_id or tool_call_id of 9 characters or numbers.') }}
        {%- endif %}

        {%- set tool_message = {'content': tool_content, 'call_id': tool_id} %}
        
        {{- '[TOOL_RESULTS]' ~ (tool_message|tojson) ~ '[/TOOL_RESULTS]' }}


    {#- Raise exception for unsupported roles. #}
    {%- else %}
        {{- raise_exception('Only user, assistant and tool roles are supported, got ' ~ message['role'] ~ '.') }}
    {%- endif %}
    {%- if message['role'] == 'user' %}
        {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
)TPL"},
      {ChatTemplate::qwq, "QwQ (with enable_thinking)", R"TPL({%- if tools %}
    {{- '<|im_start|>system\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- '' }}
    {%- endif %}
    {{- "\n\n# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with function signatures within <tools></tools> XML tags:\n<tools>" }}
    {%- for tool in tools %}
        {{- "\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\n</tools>\n\nFor each function call, return a json object with function name and arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": <args-json-object>}\n</tool_call><|im_end|>\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\n' + messages[0]['content'] + '<|im_end|>\n' }}
  {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- if (message.role == "user") or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\n' + message.content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" and not message.tool_calls %}
        {%- set content = message.content %}
        {%- if not loop.last %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role + '\n' + content + '<|im_end|>' + '\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content %}
        {%- if not loop.last %}
            {%- set content = message.content.split('</think>')[-1].lstrip('\n') %}
        {%- endif %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\n' + content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\n<tool_call>\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {{- tool_call.arguments | tojson }}
            {{- '}\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\n<tool_response>\n' }}
        {{- message.content }}
        {{- '\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\n<think>\n' }}
    {%- if not enable_thinking -%}{{- '</think>' -}}{%- endif -%}
{%- endif %}
)TPL",
       "<think>\n</think>"},
      {ChatTemplate::deepseek_r1, "DeepSeek-R1-Distill-Llama", R"TPL({% if not add_generation_prompt is defined -%}
  {%- set add_generation_prompt = false -%}
{%- endif -%}
{%- set ns = namespace(is_first=false, is_tool=false, is_output_first=true, system_prompt='') -%}
{%- for message in messages -%}
  {%- if message['role'] == 'system' -%}
    {%- set ns.system_prompt = message['content'] -%}
  {%- endif -%}
{%- endfor -%}{{bos_token}}{{ns.system_prompt}}
{%- for message in messages -%}
  {%- if message['role'] == 'user' -%}
    {%- set ns.is_tool = false -%}{{'<｜User｜>' + message['content']}}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['content'] is none -%}
    {%- set ns.is_tool = false -%}
    {%- for tool in message['tool_calls']-%}
      {%- if not ns.is_first -%}{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}
        {%- set ns.is_first = true -%}
        {%- else -%}{{'\n' + '<｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\n' + '```json' + '\n' + tool['function']['arguments'] + '\n' + '```' + '<｜tool▁call▁end｜>'}}{{'<｜tool▁calls▁end｜><｜end▁of▁sentence｜>'}}
      {%- endif -%}
    {%- endfor -%}
  {%- endif -%}
  {%- if message['role'] == 'assistant' and message['content'] is not none -%}
    {%- if ns.is_tool -%}{{'<｜tool▁outputs▁end｜>' + message['content'] + '<｜end▁of▁sentence｜>'}}
      {%- set ns.is_tool = false -%}
      {%- else -%}
      {%- set content = message['content'] -%}
      {%- if '</think>' in content -%}
        {%- set content = content.split('</think>')[-1] -%}
      {%- endif -%}{{'<｜Assistant｜>' + content + '<｜end▁of▁sentence｜>'}}
    {%- endif -%}
  {%- endif -%}
  {%- if message['role'] == 'tool' -%}
    {%- set ns.is_tool = true -%}
    {%- if ns.is_output_first -%}{{'<｜tool▁outputs▁begin｜><｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
      {%- set ns.is_output_first = false -%}
      {%- else -%}{{'\n<｜tool▁output▁begin｜>' + message['content'] + '<｜tool▁output▁end｜>'}}
    {%- endif -%}
  {%- endif -%}
{%- endfor -%}
{%- if ns.is_tool -%}{{'<｜tool▁outputs▁end｜>'}}
{%- endif -%}
{%- if add_generation_prompt and not ns.is_tool -%}{{'<｜Assistant｜><think>\n'}}
{%- endif %})TPL",
       "<think>\n"},
  };
  // Other releases of these templates, as edits of them.
  static const std::vector<KnownTemplate> with_released = [] {
    std::vector<KnownTemplate> all = known;
    auto text_of = [&](const std::string& model) {
      return std::find_if(all.begin(), all.end(), [&](const KnownTemplate& k) { return k.model == model; })->text;
    };
    // Llama 3.2's is 3.1's with today's date where the renderer offers strftime_now.
    const std::string llama32 = edited(text_of("Llama 3.1 Instruct"),
                                       {{R"({%- if not date_string is defined %}
    {%- set date_string = "26 Jul 2024" %}
{%- endif %})",
                                         R"({%- if not date_string is defined %}
    {%- if strftime_now is defined %}
        {%- set date_string = strftime_now("%d %b %Y") %}
    {%- else %}
        {%- set date_string = "26 Jul 2024" %}
    {%- endif %}
{%- endif %})"}},
                                       "Llama 3.2 Instruct");
    const Edits mistral_released{{R"({%- for message in loop_messages %}
    {%- if (message["role"] == "user") != (loop.index0 % 2 == 0) %})",
                                  R"({%- if not tools is defined %}
    {%- set tools = none %}
{%- endif %}
{%- set user_messages = loop_messages | selectattr("role", "equalto", "user") | list %}
{%- set ns = namespace() %}
{%- set ns.index = 0 %}
{%- for message in loop_messages %}
    {%- if not (message.role == "tool" or message.role == "tool_results" or (message.tool_calls is defined and message.tool_calls is not none)) %}
    {%- if (message["role"] == "user") != (ns.index % 2 == 0) %})"},
                                 {R"(    {%- endif %}
{%- endfor %}
{{- bos_token }})",
                                  R"(    {%- endif %}
    {%- set ns.index = ns.index + 1 %}
    {%- endif %}
{%- endfor %}
{{- bos_token }})"}};
    // Some releases of Mistral v0.3's template put the system message with the first user turn.
    const Edits system_first{{"loop.last and system_message", "loop.first and system_message"}};
    std::vector<KnownTemplate> more{
        {ChatTemplate::llama3_2, "Llama 3.2 Instruct", llama32},
        {ChatTemplate::llama3_1, "Llama 3.1 / 3.3 Instruct (as released)", kLlama31Released, "", true},
        {ChatTemplate::llama3_2, "Llama 3.2 Instruct (as released)", kLlama32Released, "", true},
        {ChatTemplate::qwen2_5, "Qwen2.5 / Qwen2 Instruct (as released)", kQwen25Released, "", true},
        {ChatTemplate::qwen3, "Qwen3 (first release)", kQwen3FirstRelease, "", true},
        {ChatTemplate::mistral, "Mistral v0.3 (as released)",
         edited(text_of("Mistral v0.3"), mistral_released, "Mistral v0.3 (as released)")},
        {ChatTemplate::mistral_system_first, "Mistral v0.3 with the system message first",
         edited(text_of("Mistral v0.3"), system_first, "Mistral v0.3 (system first)")},
        {ChatTemplate::mistral_system_first, "Mistral v0.3 (as released) with the system message first",
         edited(edited(text_of("Mistral v0.3"), mistral_released, "Mistral v0.3 (as released)"), system_first,
                "Mistral v0.3 (as released, system first)")},
    };
    // DeepSeek-R1-Distill-Qwen's: the Llama one's tags (its tool-call branch asks message['tool_calls'])
    // with a generation prompt that closes the reasoning unless enable_thinking is passed.
    const Edits deepseek_qwen{
        {R"({{'<｜Assistant｜><think>\n'}})",
         R"({{'<｜Assistant｜><think>\n'}}{% if not enable_thinking %}{{- '</think>' -}}{% endif %})"}};
    more.push_back({ChatTemplate::deepseek_r1, "DeepSeek-R1-Distill-Qwen",
                    edited(text_of("DeepSeek-R1-Distill-Llama"), deepseek_qwen, "DeepSeek-R1-Distill-Qwen"),
                    "<think>\n</think>"});
    // QwQ-32B's without the enable_thinking test: the reasoning stays open.
    const Edits qwq_open{{R"(
    {%- if not enable_thinking -%}{{- '</think>' -}}{%- endif -%})",
                          ""}};
    more.push_back(
        {ChatTemplate::qwq, "QwQ", edited(text_of("QwQ (with enable_thinking)"), qwq_open, "QwQ"), "<think>\n"});
    all.insert(all.end(), more.begin(), more.end());
    return all;
  }();
  return with_released;
}

// A template's profile: its literals (a default system message replaced by a slot, the message
// returned), features and tags (their literals slotted alike).
struct Profile {
  std::map<std::string, std::pair<int, int>> literals;  // literal -> {how many times, the line it first appears on}
  std::map<std::string, int> features;
  std::vector<TemplateScan::Tag> tags;
  std::string default_system;
  // Every tag, tool branches included (literals slotted alike, and a bare default system message
  // — the tool branch's — too), and where a tool branch renders text outside its tags (0: none).
  std::vector<TemplateScan::Tag> every_tag;
  int tool_text_line = 0;
};

// `literal`, or a slot for a default system message (then stored in `message`): ChatML's
// (kDefaultSystemSlot), or `named`, the one the template sets default_system_message to
// (kNamedSystemSlot).
std::string slotted(const std::string& literal, const std::string& named, std::string& message) {
  if (!named.empty() && literal == named) {
    message = literal;
    return kNamedSystemSlot;
  }
  const std::string open = "<|im_start|>system\n", close = "<|im_end|>\n";
  if (literal.size() > open.size() + close.size() && literal.rfind(open, 0) == 0 &&
      literal.compare(literal.size() - close.size(), close.size(), close) == 0) {
    const std::string middle = literal.substr(open.size(), literal.size() - open.size() - close.size());
    if (middle.find("<|") == std::string::npos) {
      message = middle;
      return kDefaultSystemSlot;
    }
  }
  return literal;
}

Profile profile_of(TemplateScan scan) {
  Profile p;
  p.features = std::move(scan.features);
  std::string named;  // `{%- set default_system_message = '...' %}` (Devstral's), a non-empty one
  for (const auto& tag : scan.tags) {
    const auto& c = tag.code;
    if (c.size() == 5 && c[0] == "{%" && c[1] == "set" && c[2] == "default_system_message" && c[3] == "=" &&
        c[4].size() > 1 && c[4][0] == '\'') {
      named = c[4].substr(1);
      break;
    }
  }
  for (const auto& lit : scan.literals) {
    auto& [count, line] =
        p.literals.emplace(slotted(lit.text, named, p.default_system), std::make_pair(0, lit.line)).first->second;
    ++count;
  }
  for (auto& tag : scan.tags)
    for (std::string& code : tag.code)
      if (!code.empty() && code[0] == '\'') {
        const std::string literal = slotted(code.substr(1), named, p.default_system);
        code.resize(1);
        code += literal;
      }
  p.tags = std::move(scan.tags);
  for (auto& tag : scan.every_tag)
    for (std::string& code : tag.code)
      if (!code.empty() && code[0] == '\'') {
        std::string message;
        const std::string literal = slotted(code.substr(1), named, message);
        code.resize(1);
        code += !p.default_system.empty() && literal == p.default_system ? std::string("\x01") : literal;
      }
  p.every_tag = std::move(scan.every_tag);
  if (!scan.tool_output_text.empty()) p.tool_text_line = scan.tool_output_text.front().line;
  return p;
}

std::string shown(const std::string& literal) {
  if (literal.empty()) return "'' (the empty string)";
  std::string s;
  for (char c : literal.substr(0, 60))
    s += c == '\n' ? std::string("\\n") : c == '\x01' ? std::string("...") : std::string(1, c);
  return "\"" + s + (literal.size() > 60 ? "...\"" : "\"");
}

// How `p` differs from `k` (the first difference), or "" where it does not: first a literal `k`
// lacks (the one the template reaches first), then a literal's count, then a feature's.
std::string difference(const Profile& p, const Profile& k, const std::string& name) {
  const std::pair<const std::string, std::pair<int, int>>* first = nullptr;
  for (const auto& entry : p.literals)
    if (!k.literals.count(entry.first) && (!first || entry.second.second < first->second.second)) first = &entry;
  if (first)
    return "line " + std::to_string(first->second.second) + ": the literal " + shown(first->first) + " is not in " +
           name + "'s template";
  for (const auto& [lit, at] : k.literals) {
    const int n = p.literals.count(lit) ? p.literals.at(lit).first : 0;
    if (n != at.first)
      return "it has " + name + "'s literal " + shown(lit) + " " + std::to_string(n) + " time(s) where " + name +
             "'s template has it " + std::to_string(at.first);
  }
  std::set<std::string> names;
  for (const auto& f : p.features) names.insert(f.first);
  for (const auto& f : k.features) names.insert(f.first);
  for (const std::string& f : names) {
    const int a = p.features.count(f) ? p.features.at(f) : 0, b = k.features.count(f) ? k.features.at(f) : 0;
    if (a != b)
      return "it uses " + f + " " + std::to_string(a) + " time(s) where " + name + "'s template uses it " +
             std::to_string(b);
  }
  return "";
}

std::string shown_tag(const std::string& source) {
  return "\"" + (source.size() > 80 ? source.substr(0, 77) + "..." : source) + "\"";
}

// The first tag where `p` and `k` differ, or "" where every tag is the same.
std::string tag_difference(const std::vector<TemplateScan::Tag>& p, const std::vector<TemplateScan::Tag>& k,
                           const std::string& name) {
  const size_t n = std::min(p.size(), k.size());
  for (size_t i = 0; i < n; ++i)
    if (p[i].code != k[i].code)
      return "line " + std::to_string(p[i].line) + ": the tag " + shown_tag(p[i].source) + " is not " + name + "'s " +
             shown_tag(k[i].source);
  if (p.size() > n)
    return "line " + std::to_string(p[n].line) + ": the tag " + shown_tag(p[n].source) + " is past the end of " + name +
           "'s template";
  if (k.size() > n) return "it ends where " + name + "'s template goes on with " + shown_tag(k[n].source);
  return "";
}

// Why a template's tool branches are not those of `released` ("" where they are).
std::string tool_difference(const Profile& p, const Profile& released, const std::string& name) {
  if (p.tool_text_line)
    return "line " + std::to_string(p.tool_text_line) + ": a tool branch renders text outside its tags";
  return tag_difference(p.every_tag, released.every_tag, name);
}

}  // namespace

std::string default_chat_template(const std::string& dir, std::string& where) { return template_text(dir, where); }

RecognizedTemplate recognize_chat_template(const std::string& text, const std::string& where) {
  const std::string options = template_options();
  TemplateScan scan;
  try {
    scan = scan_template(text);
  } catch (const RuntimeError& e) {
    throw RuntimeError(where + ": the chat template does not parse (" + e.what() + ")" + options);
  }
  if (!scan.unsupported.empty())
    throw RuntimeError(where + ": the chat template uses " + scan.unsupported.front() +
                       ", which no template ptrain renders does" + options);
  if (!scan.output_text.empty())
    throw RuntimeError(where + ": line " + std::to_string(scan.output_text.front().line) +
                       ": the chat template renders text outside its tags (" + shown(scan.output_text.front().text) +
                       "), which no template ptrain renders does" + options);
  const Profile p = profile_of(scan);
  std::string closest;
  size_t fewest = SIZE_MAX;
  static const std::vector<Profile> profiles = [] {
    std::vector<Profile> v;
    for (const KnownTemplate& k : known_templates()) v.push_back(profile_of(scan_template(k.text)));
    return v;
  }();
  for (size_t i = 0; i < profiles.size(); ++i) {
    const KnownTemplate& k = known_templates()[i];
    std::string diff = difference(p, profiles[i], k.model);
    if (diff.empty()) diff = tag_difference(p.tags, profiles[i].tags, k.model);
    if (diff.empty()) {
      RecognizedTemplate r{k.kind, k.model, p.default_system, k.think_prompt, false, ""};
      // its tools render where its tool branches are those of its family's release ptrain renders them for
      const auto released = std::find_if(known_templates().begin(), known_templates().end(),
                                         [&](const KnownTemplate& t) { return t.tools && t.kind == k.kind; });
      if (released != known_templates().end()) {
        const size_t at = static_cast<size_t>(released - known_templates().begin());
        r.no_tools = tool_difference(p, profiles[at], released->model);
        r.tools = r.no_tools.empty();
      }
      return r;
    }
    size_t missing = 0;  // how far apart: literals on one side only
    for (const auto& l : p.literals) missing += profiles[i].literals.count(l.first) ? 0 : 1;
    for (const auto& l : profiles[i].literals) missing += p.literals.count(l.first) ? 0 : 1;
    if (missing < fewest) {
      fewest = missing;
      closest = diff;
    }
  }
  throw RuntimeError(where + ": the chat template is not one ptrain renders; closest: " + closest + options);
}

std::vector<int64_t> Sample::targets() const {
  std::vector<int64_t> t;
  for (size_t i = 1; i < ids.size(); ++i) t.push_back(trained[i] ? ids[i] : -100);
  return t;
}

const std::vector<std::string>& chat_template_names() {
  static const std::vector<std::string> n{"auto",
                                          "llama3",
                                          "llama3.1",
                                          "llama3.2",
                                          "qwen2.5",
                                          "qwen3",
                                          "chatml",
                                          "mistral",
                                          "mistral-v0.2",
                                          "mistral-v0.1",
                                          "mistral-system-first",
                                          "deepseek-r1",
                                          "qwq",
                                          "mistral-nemo",
                                          "devstral",
                                          "mistral-tekken"};
  return n;
}

// The directory's own template renders `bos_token` / `eos_token` as its tokenizer's files resolve
// them (transformers); ptrain renders the released tokens there, so they must be the same.
void check_template_tokens(const Tokenizer& tok, ChatTemplate kind, const std::string& where) {
  const auto tokens = tok.template_tokens();
  if (!tokens) return;
  const bool llama = kind == ChatTemplate::llama3 || kind == ChatTemplate::llama3_1 || kind == ChatTemplate::llama3_2;
  const bool mistral = kind == ChatTemplate::mistral || kind == ChatTemplate::mistral_system_first ||
                       kind == ChatTemplate::mistral_v0_2 || kind == ChatTemplate::mistral_v0_1 ||
                       kind == ChatTemplate::mistral_nemo || kind == ChatTemplate::devstral ||
                       kind == ChatTemplate::mistral_tekken;
  auto require = [&](const char* key, const std::string& have, const char* want) {
    if (have != want)
      throw RuntimeError(where + ": the chat template renders " + key + ", which this tokenizer's files make " +
                         (have.empty() ? std::string("None (nothing)") : "'" + have + "'") +
                         " (tokenizer_config.json / special_tokens_map.json); ptrain renders '" + want +
                         "' there, as the released template does: set " + key + " to \"" + want +
                         "\", or name the template in data.chat_template");
  };
  if (llama || mistral) require("bos_token", tokens->first, llama ? "<|begin_of_text|>" : "<s>");
  if (mistral) require("eos_token", tokens->second, "</s>");
}

namespace {
// DeepSeek-R1's template renders bos_token as the directory's files resolve it (released:
// <｜begin▁of▁sentence｜>); without those files, the released one where the tokenizer has it.
std::string deepseek_bos(const Tokenizer& tok, const std::string& where) {
  static const std::string released = "<｜begin▁of▁sentence｜>";
  const auto tokens = tok.template_tokens();
  if (tokens && tokens->first.empty())
    throw RuntimeError(where + ": the chat template renders bos_token, which this tokenizer's files make None " +
                       "(tokenizer_config.json / special_tokens_map.json): set bos_token (released: \"" + released +
                       "\")");
  if (tokens) return tokens->first;
  if (!tok.splitting_token(released))
    throw RuntimeError(tok.path() + ": deepseek-r1's template renders bos_token " + released +
                       ", which this tokenizer does not have as a token: use the model's own tokenizer directory");
  return released;
}
}  // namespace

std::pair<std::string, std::string> document_markers(const Tokenizer& tok) {
  const fs::path dir = fs::path(tok.path()).parent_path();
  auto first_present = [&](const std::vector<std::string>& names) {
    for (const auto& name : names)
      if (!name.empty() && tok.splitting_token(name)) return name;
    return std::string();
  };
  // A GGUF file's bos / eos stand for tokenizer_config.json's.
  const auto gguf = tok.embedded_chat_template() ? tok.template_tokens() : std::nullopt;
  return {first_present({"<|begin_of_text|>", gguf ? gguf->first : config_token(dir, "bos_token"), "<s>"}),
          first_present(
              {"<|end_of_text|>", "<|endoftext|>", gguf ? gguf->second : config_token(dir, "eos_token"), "</s>"})};
}

// The released Devstral template's default system message (data.chat_template = "devstral"; a
// directory's template gives its own): the first literal of its template, what it sets
// default_system_message to.
const std::string& devstral_system() {
  static const std::string text = [] {
    for (const KnownTemplate& k : known_templates())
      if (k.kind == ChatTemplate::devstral) return scan_template(k.text).literals.front().text;
    throw std::logic_error("known_templates: no Devstral template");
  }();
  return text;
}

ChatFormat chat_format(const Tokenizer& tok, ChatTemplate requested) {
  const fs::path dir = fs::path(tok.path()).parent_path();
  ChatFormat f;
  f.kind = requested;
  f.source = "data.chat_template";
  if (requested == ChatTemplate::automatic) {
    std::string where;
    const auto& embedded = tok.embedded_chat_template();  // a GGUF file's tokenizer.chat_template
    const std::string t = embedded ? *embedded : template_text(dir, where);
    if (embedded) where = tok.path() + " (tokenizer.chat_template)";
    f.source = where;
    const std::string options = template_options();
    if (t.empty()) {
      const std::string holder = embedded ? tok.path() + " (tokenizer.chat_template)"
                                          : dir.string() + " (tokenizer_config.json / chat_template.jinja)";
      if (!tok.splitting_token("<|start_header_id|>"))
        throw RuntimeError("no chat template in " + holder + " and the tokenizer is not Llama 3's" + options);
      f.kind = ChatTemplate::llama3;
      f.source = "Llama 3's header tokens (no template in " + holder + ")";
    } else {
      const RecognizedTemplate known = recognize_chat_template(t, where);
      f.kind = known.kind;
      f.default_system = known.default_system;
      f.source = where + ", " + known.model + "'s template";
      f.think_prompt = known.think_prompt;
      f.tools = known.tools;
      if (!known.no_tools.empty())
        f.no_tools = where + ": its tool branches are not the released ones ptrain renders (" + known.no_tools + ")";
      check_template_tokens(tok, f.kind, where);
    }
  }
  if (requested == ChatTemplate::qwq || requested == ChatTemplate::deepseek_r1) f.think_prompt = "<think>\n";
  if (f.kind == ChatTemplate::deepseek_r1) {
    f.bos_token = deepseek_bos(tok, f.source);
  }
  if (requested == ChatTemplate::qwen2_5) f.default_system = kQwenSystem;
  // the released templates, tool branches and all
  if (requested == ChatTemplate::qwen2_5 || requested == ChatTemplate::llama3_1 ||
      requested == ChatTemplate::llama3_2 || requested == ChatTemplate::mistral_nemo)
    f.tools = true;
  if (requested == ChatTemplate::devstral) f.default_system = devstral_system();
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

ChatFormat data_chat_format(const Tokenizer& tok, ChatTemplate requested) {
  try {
    return chat_format(tok, requested);
  } catch (const RuntimeError& e) {
    ChatFormat f;
    f.kind = ChatTemplate::automatic;
    f.source = "none usable";
    f.unavailable = e.what();
    return f;
  }
}

namespace {
const std::string& template_name(const ChatFormat& f) { return chat_template_names()[static_cast<size_t>(f.kind)]; }

// Throws NoChatTemplate for a format without a template (data_chat_format).
void require_template(const ChatFormat& f) {
  if (f.kind == ChatTemplate::automatic)
    throw NoChatTemplate(f.unavailable.empty() ? "a chat needs a resolved chat format (chat_format)"
                                               : "a chat record, and " + f.unavailable);
}

void check_role(const ChatFormat& f, const ChatMessage& m, std::initializer_list<const char*> roles) {
  for (const char* r : roles)
    if (m.role == r) return;
  std::string names;
  for (const char* r : roles) names += (names.empty() ? "" : ", ") + std::string(r);
  throw RuntimeError("unknown role '" + m.role + "' in a chat message (" + template_name(f) + " takes " + names + ")");
}

void check_reasoning(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i)
    if (messages[i].reasoning && (f.kind != ChatTemplate::qwen3 || messages[i].role != "assistant"))
      throw RuntimeError("message " + std::to_string(i + 1) + " holds reasoning_content, which only Qwen3's template " +
                         "renders, and only in a reply (these chats render as " + template_name(f) +
                         "): write it into the content, or list it in data.ignore_fields to leave it out knowingly");
}

// The tool instructions Llama 3.1 / 3.2's released templates put before the first user message's
// content (tools_in_user_message, their default): each tool as `tojson(indent=4)` renders it.
std::string llama_tools_text(const std::vector<std::string>& tools) {
  std::string text =
      "Given the following functions, please respond with a JSON for a function call with its proper arguments "
      "that best answers the given prompt.\n\nRespond in the format {\"name\": function name, \"parameters\": "
      "dictionary of argument name and its value}.Do not use variables.\n\n";
  for (const std::string& tool : tools) text += python_json(nlohmann::ordered_json::parse(tool), 4) + "\n\n";
  return text;
}

// Llama 3.1 / 3.2's released templates: a reply with a tool call renders the call alone —
// {"name": "NAME", "parameters": ARGUMENTS} — and a tool result (role "tool" or "ipython") as an
// "ipython" turn holding its content as `tojson` quotes a string.
void llama_tool_parts(const std::vector<ChatMessage>& messages, size_t i, std::vector<Part>& parts) {
  const ChatMessage& m = messages[i];
  const std::string number = "message " + std::to_string(i + 1);
  const bool reply = m.tool_calls_listed;
  if (reply && m.tool_calls.size() != 1)
    throw RuntimeError(number + " lists " + std::to_string(m.tool_calls.size()) +
                       " tool calls, and Llama 3.1's template renders one call per reply (it raises \"This model "
                       "only supports single tool-calls at once!\"): give each call a reply of its own, its result "
                       "after it" +
                       (m.tool_calls.empty() ? std::string(", or drop the empty \"tool_calls\"") : std::string()));
  if (reply && !m.tool_calls[0].in_function)
    throw RuntimeError(number +
                       "'s tool call is not inside \"function\" ({\"function\": {\"name\", \"arguments\"}}), " +
                       "the only form Llama 3.1's template reads (it raises on another)");
  parts.push_back({"<|start_header_id|>", false});
  parts.push_back({reply ? "assistant" : "ipython", false});
  parts.push_back({"<|end_header_id|>", false});
  parts.push_back({"\n\n", false});
  if (reply) {
    const ToolCall& call = m.tool_calls[0];
    parts.push_back({"{\"name\": \"" + call.name + "\", \"parameters\": " + call.arguments + "}", true});
  } else {
    parts.push_back({python_json(nlohmann::ordered_json(m.content)), false});
  }
  parts.push_back({"<|eot_id|>", reply});
}

// Llama 3 / 3.1 / 3.2: 3.1 and 3.2 open with a dated system header holding the system message;
// with tools, the first user message holds them.
std::vector<Part> llama3_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages, const ChatTools& tools) {
  std::vector<Part> parts{{"<|begin_of_text|>", false}};
  const auto header = [&](const std::string& role) {
    parts.push_back({"<|start_header_id|>", false});
    parts.push_back({role, false});
    parts.push_back({"<|end_header_id|>", false});
  };
  size_t first = 0;
  if (f.kind != ChatTemplate::llama3) {  // the dated system header, the system message in it
    const bool system = !messages.empty() && messages[0].role == "system";
    header("system");
    parts.push_back({"\n\n" + std::string(tools ? "Environment: ipython\n" : "") +
                         "Cutting Knowledge Date: December 2023\nToday Date: " + f.date + "\n\n" +
                         (system ? trim(messages[0].content) : std::string()),
                     false});
    parts.push_back({"<|eot_id|>", false});
    first = system ? 1 : 0;
  }
  if (tools) {  // check_tools: a format that renders tools, so Llama 3.1 / 3.2's released templates
    if (first == messages.size())
      throw RuntimeError(
          "a chat with tools needs a user message after the system message: Llama 3.1's template puts "
          "the tools in it (it raises on a chat without one)");
    const ChatMessage& u = messages[first];
    if (u.role != "user")
      throw RuntimeError("message " + std::to_string(first + 1) + " is the " + u.role +
                         "'s, where Llama 3.1's template takes the chat's first message after the system message as "
                         "the user message holding the tools (it would render this one's text as the user's): "
                         "start the chat with a user turn");
    header("user");
    parts.push_back({"\n\n" + llama_tools_text(*tools) + trim(u.content), false});
    parts.push_back({"<|eot_id|>", false});
    ++first;
  }
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    // Llama 3.1 / 3.2's templates render tool calls and results (tool, ipython) through their tool branch.
    if (f.tools && (m.role == "tool" || m.role == "ipython" || m.tool_calls_listed)) {
      llama_tool_parts(messages, i, parts);
      continue;
    }
    if (f.kind == ChatTemplate::llama3)
      check_role(f, m, {"system", "user", "assistant", "ipython"});
    else
      check_role(f, m, {"system", "user", "assistant"});
    const bool reply = m.role == "assistant";
    header(m.role);
    parts.push_back({"\n\n", false});
    parts.push_back({trim(m.content), reply});
    parts.push_back({"<|eot_id|>", reply});
  }
  return parts;
}

// ChatML and Qwen2.5 (which adds its default system message where the chat has none).
std::string strip_newlines(const std::string& s, bool left, bool right) {
  size_t b = 0, e = s.size();
  while (left && b < e && s[b] == '\n') ++b;
  while (right && e > b && s[e - 1] == '\n') --e;
  return s.substr(b, e - b);
}

// A reply's text after its last "</think>": the template's content.split('</think>')[-1].
std::string after_reasoning(const std::string& content) {
  const size_t end = content.rfind("</think>");
  return end == std::string::npos ? content : content.substr(end + std::string("</think>").size());
}

// The tools as Qwen2.5's and Qwen3's released templates list them in the system turn: one `tojson`
// line each, between their instructions.
std::string tools_block(const std::vector<std::string>& tools) {
  std::string text =
      "# Tools\n\nYou may call one or more functions to assist with the user query.\n\nYou are provided with "
      "function signatures within <tools></tools> XML tags:\n<tools>";
  for (const std::string& tool : tools) text += "\n" + tool;
  return text +
         "\n</tools>\n\nFor each function call, return a json object with function name and arguments within "
         "<tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
         "<args-json-object>}\n</tool_call>";
}

// Qwen2.5's released template with tools: the system turn holds the chat's system message, else the
// default one, then the tools.
std::string qwen25_tools_system(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                                const std::vector<std::string>& tools) {
  return "system\n" + (!messages.empty() && messages[0].role == "system" ? messages[0].content : f.default_system) +
         "\n\n" + tools_block(tools);
}

// Qwen2.5's and Qwen3's released templates: a run of tool results as one user turn of
// <tool_response> blocks.
void tool_result_parts(const std::vector<ChatMessage>& messages, size_t i, std::vector<Part>& parts) {
  if (i == 0 || messages[i - 1].role != "tool") {
    parts.push_back({"<|im_start|>", false});
    parts.push_back({"user", false});
  }
  parts.push_back({"\n<tool_response>\n" + messages[i].content + "\n</tool_response>", false});
  if (i + 1 == messages.size() || messages[i + 1].role != "tool") {
    parts.push_back({"<|im_end|>", false});
    parts.push_back({"\n", false});
  }
}

// A tool call as both templates write it: {"name": "NAME", "arguments": ARGS}, ARGS as `tojson`
// renders them (Qwen2.5's), or a string given as is where Qwen3's renders it so.
std::string tool_call_text(const ToolCall& call, bool string_as_is) {
  return "<tool_call>\n{\"name\": \"" + call.name +
         "\", \"arguments\": " + (string_as_is && call.text ? *call.text : call.arguments) + "}\n</tool_call>";
}

// Qwen2.5's released template: a reply's tool calls after its role header and content, and a run of
// tool results as one user turn.
void qwen25_tool_parts(const std::vector<ChatMessage>& messages, size_t i, std::vector<Part>& parts) {
  const ChatMessage& m = messages[i];
  if (m.role == "assistant") {
    parts.push_back({"<|im_start|>", false});
    parts.push_back({"assistant\n", false});
    std::string text = m.content.empty() ? "" : m.content + "\n";  // the template's '\n' + content
    for (size_t c = 0; c < m.tool_calls.size(); ++c)
      text += std::string(c ? "\n" : "") + tool_call_text(m.tool_calls[c], false);
    parts.push_back({text, true});
    parts.push_back({"<|im_end|>", true});
    parts.push_back({"\n", true});
    return;
  }
  tool_result_parts(messages, i, parts);
}

std::vector<Part> chatml_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                               const std::vector<std::string>& tools) {
  std::vector<Part> parts;
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {  // Qwen2.5's: the system message goes into the tools' system turn
    parts.push_back({"<|im_start|>", false});
    parts.push_back({qwen25_tools_system(f, messages, tools), false});
    parts.push_back({"<|im_end|>", false});
    parts.push_back({"\n", false});
  } else if (!f.default_system.empty() && !system_first) {
    parts.push_back({"<|im_start|>", false});
    parts.push_back({"system\n" + f.default_system, false});
    parts.push_back({"<|im_end|>", false});
    parts.push_back({"\n", false});
  }
  for (size_t i = !tools.empty() && system_first ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (f.tools && (m.role == "tool" || !m.tool_calls.empty())) {
      qwen25_tool_parts(messages, i, parts);
      continue;
    }
    check_role(f, m, {"system", "user", "assistant"});
    const bool reply = m.role == "assistant";
    // QwQ: a reply before the chat's last message loses its reasoning (and the newlines after it).
    const bool drop = reply && f.kind == ChatTemplate::qwq && i + 1 < messages.size();
    parts.push_back({"<|im_start|>", false});
    parts.push_back({m.role + "\n", false});
    parts.push_back({drop ? strip_newlines(after_reasoning(m.content), true, false) : m.content, reply});
    parts.push_back({"<|im_end|>", reply});
    parts.push_back({"\n", reply});
  }
  return parts;
}

// Qwen3's last user turn (not a tool response): replies after it keep their reasoning, earlier ones lose it.
size_t qwen3_last_query(const std::vector<ChatMessage>& messages) {
  for (size_t i = messages.size(); i-- > 0;) {
    const std::string& c = messages[i].content;
    const bool tool_response =
        c.rfind("<tool_response>", 0) == 0 && c.size() >= 16 && c.compare(c.size() - 16, 16, "</tool_response>") == 0;
    if (messages[i].role == "user" && !tool_response) return i;
  }
  return messages.empty() ? 0 : messages.size() - 1;
}

// A Qwen3 reply's reasoning and content: reasoning_content given apart (the content stays
// whole), or split at "</think>" as the template's Python split('</think>')[0] / [-1] does.
std::pair<std::string, std::string> qwen3_reasoning_and_content(const ChatMessage& m) {
  std::string content = m.content, reasoning;
  const size_t close = content.find("</think>");
  if (m.reasoning) {
    reasoning = *m.reasoning;
  } else if (close != std::string::npos) {
    std::string before = strip_newlines(content.substr(0, close), false, true);
    const size_t open = before.rfind("<think>");
    reasoning = strip_newlines(open == std::string::npos ? before : before.substr(open + 7), true, false);
    content = strip_newlines(content.substr(content.rfind("</think>") + 8), true, false);
  }
  return {reasoning, content};
}

// Qwen3's first release with tools: the system turn holds the chat's system message (and a blank
// line) where it has one — no default —, then the tools.
std::string qwen3_tools_system(const std::vector<ChatMessage>& messages, const std::vector<std::string>& tools) {
  const bool system = !messages.empty() && messages[0].role == "system";
  return "system\n" + (system ? messages[0].content + "\n\n" : std::string()) + tools_block(tools);
}

std::vector<Part> qwen3_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                              const std::vector<std::string>& tools) {
  std::vector<Part> parts;
  const bool system_first = !messages.empty() && messages[0].role == "system";
  if (!tools.empty()) {
    parts.push_back({"<|im_start|>", false});
    parts.push_back({qwen3_tools_system(messages, tools), false});
    parts.push_back({"<|im_end|>", false});
    parts.push_back({"\n", false});
  }
  const size_t last_query = qwen3_last_query(messages);
  for (size_t i = !tools.empty() && system_first ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (f.tools && m.role == "tool") {
      tool_result_parts(messages, i, parts);
      continue;
    }
    check_role(f, m, {"system", "user", "assistant"});
    parts.push_back({"<|im_start|>", false});
    if (m.role != "assistant") {
      parts.push_back({m.role + "\n" + m.content, false});
      parts.push_back({"<|im_end|>", false});
      parts.push_back({"\n", false});
      continue;
    }
    const auto [reasoning, content] = qwen3_reasoning_and_content(m);
    parts.push_back({"assistant\n", false});
    if (i > last_query && (i + 1 == messages.size() || !reasoning.empty())) {
      parts.push_back({"<think>", true});
      parts.push_back({"\n" + strip_newlines(reasoning, true, true) + "\n", true});
      parts.push_back({"</think>", true});
      parts.push_back({"\n\n" + strip_newlines(content, true, false), true});
    } else {
      parts.push_back({content, true});
    }
    if (!m.tool_calls.empty()) {  // a newline before each but a first one after no content
      if (m.content_null)
        throw RuntimeError("message " + std::to_string(i + 1) +
                           " calls tools without a content (null), which Qwen3's template (first release) cannot "
                           "render (transformers raises): give it \"content\": \"\"");
      std::string calls;
      for (size_t c = 0; c < m.tool_calls.size(); ++c)
        calls += std::string(c || !content.empty() ? "\n" : "") + tool_call_text(m.tool_calls[c], true);
      parts.push_back({calls, true});
    }
    parts.push_back({"<|im_end|>", true});
    parts.push_back({"\n", true});
  }
  return parts;
}

// A tool call's or result's id as Mistral Nemo's template checks it: 9 characters.
const std::string& nemo_id(const std::optional<std::string>& id, const std::string& what) {
  if (!id || code_points(*id) != 9)
    throw RuntimeError(what +
                       " needs an id of 9 characters (a string), which Mistral Nemo's template writes (it "
                       "raises otherwise: \"Tool call IDs should be alphanumeric strings with length 9!\")");
  return *id;
}

// Mistral Nemo's released template: the tools as it lists them before the last user message, each
// tool's "function" item by item ("return" left out) — a string written as is between quotes, any
// other value as `tojson` renders it —, "[" and no "]" for an empty list, as there.
std::string nemo_tools_text(const std::vector<std::string>& tools) {
  std::string text = "[";
  for (size_t t = 0; t < tools.size(); ++t) {
    const auto tool = nlohmann::ordered_json::parse(tools[t]);
    if (!tool.contains("function") || !tool.at("function").is_object())
      throw RuntimeError("tool " + std::to_string(t + 1) +
                         " has no \"function\" object, which Mistral Nemo's template lists (it raises on a tool "
                         "without one)");
    text += "{\"type\": \"function\", \"function\": {";
    bool first = true;
    for (auto it = tool.at("function").begin(); it != tool.at("function").end(); ++it) {
      if (it.key() == "return") continue;
      text += first ? "\"" : ", \"";
      text += it.key() + "\": ";
      if (it.value().is_string())
        text.append(1, '"').append(it.value().get_ref<const std::string&>()).append(1, '"');
      else
        text += python_json(it.value());
      first = false;
    }
    text += t + 1 < tools.size() ? "}}, " : "}}]";
  }
  return text;
}

// Mistral Nemo's released template: a reply's calls as "[TOOL_CALLS][" + each call's "function"
// as `tojson` renders it with its id added + "]" and the end of turn (its text dropped, as the
// template drops it); a tool result as "[TOOL_RESULTS]{"content": RESULT, "call_id": ID}[/TOOL_RESULTS]".
void nemo_tool_parts(const ChatMessage& m, size_t i, std::vector<Part>& parts) {
  const std::string number = "message " + std::to_string(i + 1);
  if (m.role == "tool") {
    parts.push_back({"[TOOL_RESULTS]", false});
    parts.push_back({"{\"content\": " + m.content + ", \"call_id\": \"" +
                         nemo_id(m.tool_call_id, number + " (a tool result; its \"tool_call_id\")") + "\"}",
                     false});
    parts.push_back({"[/TOOL_RESULTS]", false});
    return;
  }
  if (m.tool_calls.empty())
    throw RuntimeError(number +
                       "'s \"tool_calls\" is an empty list, which Mistral Nemo's template renders as "
                       "\"[TOOL_CALLS][\" with no end of turn: drop it");
  std::string calls = "[";
  for (size_t c = 0; c < m.tool_calls.size(); ++c) {
    const ToolCall& call = m.tool_calls[c];
    const std::string which = number + "'s tool call " + std::to_string(c + 1);
    if (!call.in_function)
      throw RuntimeError(which + " is not inside \"function\" ({\"function\": {\"name\", \"arguments\"}}), the " +
                         "only form Mistral Nemo's template reads (it raises on another)");
    const std::string& id = nemo_id(call.id, which);
    calls += call.function_json.substr(0, call.function_json.rfind('}')) + ", \"id\": \"" + id + "\"}" +
             (c + 1 < m.tool_calls.size() ? ", " : "]");
  }
  parts.push_back({"[TOOL_CALLS]", true});
  parts.push_back({calls, true});
  parts.push_back({"</s>", true});
}

// Mistral v0.3: "[INST] (system before the last user turn) CONTENT[/INST]", replies trimmed (the
// system message before the first user turn with mistral-system-first);
// v0.2: " [INST] (system before the first user turn) CONTENT [/INST]", replies as written;
// Nemo: "[INST](system before the last user turn)CONTENT[/INST]", replies as written, no space before;
// with its released template's tools (f.tools), "[AVAILABLE_TOOLS]...[/AVAILABLE_TOOLS]" before the
// last user message (and any equal to it) and tool calls and results (nemo_tool_parts), which the
// turns' alternation skips.
std::vector<Part> mistral_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages, const ChatTools& tools) {
  const bool v3 = f.kind != ChatTemplate::mistral_v0_2;
  const bool nemo = f.kind == ChatTemplate::mistral_nemo;
  const bool system_last = f.kind == ChatTemplate::mistral || nemo;
  const bool system = !messages.empty() && messages[0].role == "system";
  const size_t first = system ? 1 : 0;
  const std::string* last_user = nullptr;  // the template's user_messages[-1], compared by value
  for (size_t i = first; i < messages.size(); ++i)
    if (messages[i].role == "user") last_user = &messages[i].content;
  std::vector<Part> parts{{"<s>", false}};
  size_t turn = 0;  // the alternation's index: tool calls and results are not counted
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    if (nemo && f.tools && (m.role == "tool" || m.tool_calls_listed)) {
      nemo_tool_parts(m, i, parts);
      continue;
    }
    check_role(f, m, {"user", "assistant"});
    if ((m.role == "user") != (turn++ % 2 == 0))
      throw RuntimeError(template_name(f) +
                         "'s template takes an optional system message, then user and assistant turns "
                         "alternating, starting with user");
    if (m.role != "user") {
      parts.push_back({nemo ? m.content : " " + (v3 ? trim(m.content) : m.content), true});
      parts.push_back({"</s>", true});
      continue;
    }
    const bool with_system = system && (system_last ? i + 1 == messages.size() : i == first);
    const std::string text = (with_system ? messages[0].content + "\n\n" : std::string()) + m.content;
    if (nemo && tools && m.content == *last_user) {
      parts.push_back({"[AVAILABLE_TOOLS]", false});
      parts.push_back({nemo_tools_text(*tools), false});
      parts.push_back({"[/AVAILABLE_TOOLS]", false});
    }
    if (v3) {
      parts.push_back({"[INST]", false});
      parts.push_back({nemo ? text : " " + text, false});
      parts.push_back({"[/INST]", false});
    } else {
      parts.push_back({" [INST] " + text + " [/INST]", false});
    }
  }
  return parts;
}

// Devstral Small 2507: <s>, "[SYSTEM_PROMPT]" + the first message's content if it is a system
// message, else the template's default one + "[/SYSTEM_PROMPT]"; then each message in order, in
// any order of roles: "[INST]CONTENT[/INST]", "[SYSTEM_PROMPT]CONTENT[/SYSTEM_PROMPT]", a reply
// "CONTENT</s>" as written.
std::vector<Part> devstral_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  const bool system = !messages.empty() && messages[0].role == "system";
  std::vector<Part> parts{{"<s>", false},
                          {"[SYSTEM_PROMPT]", false},
                          {system ? messages[0].content : f.default_system, false},
                          {"[/SYSTEM_PROMPT]", false}};
  for (size_t i = system ? 1 : 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    check_role(f, m, {"system", "user", "assistant"});
    if (m.role == "assistant") {
      parts.push_back({m.content, true});
      parts.push_back({"</s>", true});
      continue;
    }
    const bool user = m.role == "user";
    parts.push_back({user ? "[INST]" : "[SYSTEM_PROMPT]", false});
    parts.push_back({m.content, false});
    parts.push_back({user ? "[/INST]" : "[/SYSTEM_PROMPT]", false});
  }
  return parts;
}

// mistral-common's template for a Tekken v3 vocabulary: <s>, then the chat without its system
// messages, consecutive messages of one role merged (contents joined by "\n\n"): user turns
// "[INST]CONTENT[/INST]" — the last one's content after the system messages joined by "\n\n" and
// "\n\n" —, replies "CONTENT</s>" as written. The template raises where the first turn is not the
// user's or a reply is empty.
std::vector<Part> mistral_tekken_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  std::string system;
  bool any_system = false;
  std::vector<ChatMessage> turns;
  for (const ChatMessage& m : messages) {
    check_role(f, m, {"system", "user", "assistant"});
    if (m.role == "system") {
      system += (any_system ? "\n\n" : "") + m.content;
      any_system = true;
    } else if (!turns.empty() && turns.back().role == m.role) {
      turns.back().content += "\n\n" + m.content;
    } else {
      turns.push_back(m);
    }
  }
  if (!turns.empty() && turns[0].role != "user")
    throw RuntimeError(template_name(f) + "'s template takes a user turn first (after the system messages)");
  size_t last_user = 0;
  for (size_t i = 0; i < turns.size(); ++i)
    if (turns[i].role == "user") last_user = i;
  std::vector<Part> parts{{"<s>", false}};
  for (size_t i = 0; i < turns.size(); ++i) {
    const ChatMessage& m = turns[i];
    if (m.role == "assistant") {
      if (m.content.empty()) throw RuntimeError(template_name(f) + "'s template refuses an empty reply");
      parts.push_back({m.content, true});
      parts.push_back({"</s>", true});
      continue;
    }
    parts.push_back({"[INST]", false});
    parts.push_back({(i == last_user && !system.empty() ? system + "\n\n" : std::string()) + m.content, false});
    parts.push_back({"[/INST]", false});
  }
  return parts;
}

// Mistral v0.1: "[INST] CONTENT [/INST]REPLY</s> [INST] ..."; no system message.
std::vector<Part> mistral_v0_1_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  std::vector<Part> parts{{"<s>", false}};
  for (size_t i = 0; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    check_role(f, m, {"user", "assistant"});
    if ((m.role == "user") != (i % 2 == 0))
      throw RuntimeError("mistral-v0.1's template takes user and assistant turns alternating, starting with user");
    if (m.role == "user") {
      parts.push_back({(i > 0 ? " [INST] " : "[INST] ") + m.content + " [/INST]", false});
    } else {
      parts.push_back({m.content, true});
      parts.push_back({"</s>", true});
      if (i + 1 == messages.size()) parts.push_back({" ", false});  // the next turn's space: not trained
    }
  }
  return parts;
}

// DeepSeek-R1's distilled models: bos_token and the last system message, then "<｜User｜>CONTENT"
// and "<｜Assistant｜>" + the reply after its last "</think>" (Python's split('</think>')[-1]) +
// "<｜end▁of▁sentence｜>", trained.
std::vector<Part> deepseek_r1_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  std::string system;
  for (const ChatMessage& m : messages) {
    check_role(f, m, {"system", "user", "assistant"});
    if (m.role == "system") system = m.content;
  }
  std::vector<Part> parts{{f.bos_token, false}, {system, false}};
  for (const ChatMessage& m : messages) {
    if (m.role == "user") {
      parts.push_back({"<｜User｜>", false});
      parts.push_back({m.content, false});
    } else if (m.role == "assistant") {
      parts.push_back({"<｜Assistant｜>", false});
      parts.push_back({after_reasoning(m.content), true});
      parts.push_back({"<｜end▁of▁sentence｜>", true});
    }
  }
  return parts;
}

// A chat with tools, tool calls or tool results is rendered only by a format with `tools`. Qwen's
// templates render no tools for an empty list (`if tools`); Llama 3.1's and Nemo's do (`tools is
// not none`).
void check_tools(const ChatFormat& f, const std::vector<ChatMessage>& messages, const ChatTools& tools) {
  if (f.tools) return;
  const bool llama = f.kind == ChatTemplate::llama3_1 || f.kind == ChatTemplate::llama3_2;
  const bool any_list = llama || f.kind == ChatTemplate::mistral_nemo;
  std::string what = tools && (!tools->empty() || any_list) ? "the chat's tools" : "";
  for (size_t i = 0; i < messages.size() && what.empty(); ++i) {
    const bool result = messages[i].role == "tool" || (llama && messages[i].role == "ipython");
    // an empty list too where the template routes on the key ('tool_calls' in message), as Llama 3.1's and Nemo's
    if (!messages[i].tool_calls.empty() || (any_list && messages[i].tool_calls_listed) || result)
      what = "message " + std::to_string(i + 1) + (result ? "'s tool result" : "'s tool calls");
  }
  if (what.empty()) return;
  throw RuntimeError(what +
                     ": ptrain renders tools, tool calls and tool results only with the released templates of "
                     "Qwen2.5, of Qwen3 (its first release), of Llama 3.1 / 3.2 / 3.3 and of Mistral Nemo, " +
                     (f.no_tools.empty() ? "and these chats render as " + template_name(f) : f.no_tools) +
                     " (set data.chat_template to \"qwen2.5\", \"llama3.1\", \"llama3.2\" or \"mistral-nemo\" if "
                     "the data was made for one of them)");
}

// The chat as its template renders it, in parts: template text and message text, each with
// whether it is trained (a reply's).
std::vector<Part> chat_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                             const ChatTools& tools = std::nullopt) {
  check_tools(f, messages, tools);
  switch (f.kind) {
    case ChatTemplate::llama3:
    case ChatTemplate::llama3_1:
    case ChatTemplate::llama3_2:
      return llama3_parts(f, messages, tools);
    case ChatTemplate::qwen2_5:
    case ChatTemplate::chatml:
    case ChatTemplate::qwq:
      return chatml_parts(f, messages, tools.value_or(std::vector<std::string>{}));
    case ChatTemplate::qwen3:
      return qwen3_parts(f, messages, tools.value_or(std::vector<std::string>{}));
    case ChatTemplate::mistral:
    case ChatTemplate::mistral_system_first:
    case ChatTemplate::mistral_v0_2:
    case ChatTemplate::mistral_nemo:
      return mistral_parts(f, messages, tools);
    case ChatTemplate::devstral:
      return devstral_parts(f, messages);
    case ChatTemplate::mistral_tekken:
      return mistral_tekken_parts(f, messages);
    case ChatTemplate::mistral_v0_1:
      return mistral_v0_1_parts(f, messages);
    case ChatTemplate::deepseek_r1:
      return deepseek_r1_parts(f, messages);
    case ChatTemplate::automatic:
      break;
  }
  throw RuntimeError("render_chat needs a resolved chat format (chat_format)");
}
}  // namespace

int64_t replies_losing_reasoning(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  // every record passes here: the other formats render a reply as written
  if (f.kind != ChatTemplate::qwen3 && f.kind != ChatTemplate::qwq && f.kind != ChatTemplate::deepseek_r1) return 0;
  const size_t last_query = qwen3_last_query(messages);
  int64_t n = 0;
  for (size_t i = 0; i < messages.size(); ++i) {
    // a reply with reasoning, as Qwen3's template reads it (the others take no reasoning_content)
    if (messages[i].role != "assistant" || qwen3_reasoning_and_content(messages[i]).first.empty()) continue;
    // the conditions of qwen3_parts, chatml_parts and deepseek_r1_parts
    n += (f.kind == ChatTemplate::qwen3 && i <= last_query) ||
         (f.kind == ChatTemplate::qwq && i + 1 < messages.size()) || f.kind == ChatTemplate::deepseek_r1;
  }
  return n;
}

int64_t replies_losing_call_text(const ChatFormat& f, const std::vector<ChatMessage>& messages) {
  if (!f.tools ||
      (f.kind != ChatTemplate::llama3_1 && f.kind != ChatTemplate::llama3_2 && f.kind != ChatTemplate::mistral_nemo))
    return 0;
  return std::count_if(messages.begin(), messages.end(),
                       [](const ChatMessage& m) { return m.tool_calls_listed && !m.content.empty(); });
}

Sample render_chat(const Tokenizer& tok, const ChatFormat& f, const std::vector<ChatMessage>& messages,
                   bool train_on_prompt, const ChatTools& tools) {
  require_template(f);
  check_reasoning(f, messages);
  return tokenize_parts(tok, chat_parts(f, messages, tools), train_on_prompt);
}

namespace {
// A prompt's chat, checked (it ends with a user message or a tool result), and the template's
// generation prompt.
std::vector<Part> prompt_parts(const ChatFormat& f, const std::vector<ChatMessage>& messages,
                               const ChatTools& tools = std::nullopt) {
  require_template(f);
  const std::string last = messages.empty() ? "" : messages.back().role;
  if (last != "user" && last != "tool" && last != "ipython")
    throw RuntimeError("a prompt to answer must end with a user message or a tool result");
  check_reasoning(f, messages);
  std::vector<Part> parts = chat_parts(f, messages, tools);
  switch (f.kind) {
    case ChatTemplate::llama3:
    case ChatTemplate::llama3_1:
    case ChatTemplate::llama3_2:
      for (const char* t : {"<|start_header_id|>", "assistant", "<|end_header_id|>", "\n\n"})
        parts.push_back({t, false});
      break;
    case ChatTemplate::qwen2_5:
    case ChatTemplate::qwen3:
    case ChatTemplate::chatml:
      for (const char* t : {"<|im_start|>", "assistant\n"}) parts.push_back({t, false});
      break;
    case ChatTemplate::qwq:
      for (const char* t : {"<|im_start|>", "assistant\n"}) parts.push_back({t, false});
      parts.push_back({f.think_prompt, false});
      break;
    case ChatTemplate::deepseek_r1:
      parts.push_back({"<｜Assistant｜>", false});
      parts.push_back({f.think_prompt, false});
      break;
    case ChatTemplate::mistral:
    case ChatTemplate::mistral_system_first:
    case ChatTemplate::mistral_v0_2:
    case ChatTemplate::mistral_v0_1:
    case ChatTemplate::mistral_nemo:
    case ChatTemplate::devstral:
    case ChatTemplate::mistral_tekken:
    case ChatTemplate::automatic:
      break;
  }
  return parts;
}

std::string joined(const std::vector<Part>& parts) {
  std::string text;
  for (const Part& p : parts) text += p.text;
  return text;
}
}  // namespace

std::vector<int32_t> render_prompt(const Tokenizer& tok, const ChatFormat& f, const std::vector<ChatMessage>& messages,
                                   const ChatTools& tools) {
  return tokenize_parts(tok, prompt_parts(f, messages, tools), true).ids;
}

std::string chat_text(const ChatFormat& f, const std::vector<ChatMessage>& messages, bool generation_prompt,
                      const ChatTools& tools) {
  if (generation_prompt) return joined(prompt_parts(f, messages, tools));
  require_template(f);
  check_reasoning(f, messages);
  return joined(chat_parts(f, messages, tools));
}

std::string end_of_turn(const ChatFormat& f) {
  switch (f.kind) {
    case ChatTemplate::qwen2_5:
    case ChatTemplate::qwen3:
    case ChatTemplate::chatml:
    case ChatTemplate::qwq:
      return "<|im_end|>";
    case ChatTemplate::mistral:
    case ChatTemplate::mistral_system_first:
    case ChatTemplate::mistral_v0_2:
    case ChatTemplate::mistral_v0_1:
    case ChatTemplate::mistral_nemo:
    case ChatTemplate::devstral:
    case ChatTemplate::mistral_tekken:
      return "</s>";
    case ChatTemplate::deepseek_r1:
      return "<｜end▁of▁sentence｜>";
    default:
      return "<|eot_id|>";
  }
}

}  // namespace ptrain
