// Training samples from conversations and documents, rendered as the model's own chat template
// renders them, with the loss mask: which positions the model is trained to predict.
//
// Templates (hand-written renderers, each proven equal — ids and mask — to transformers'
// apply_chat_template with that template: Chat.* tests):
//   llama3    Llama 3 Instruct: <|begin_of_text|>, per message
//             <|start_header_id|>ROLE<|end_header_id|>\n\n CONTENT (trimmed) <|eot_id|>
//   llama3.1  Llama 3.1 Instruct: llama3 plus a system header first, "Cutting Knowledge Date:
//             December 2023\nToday Date: 26 Jul 2024\n\n" + the system message (trimmed)
//   llama3.2  Llama 3.2 Instruct: llama3.1 with today's date (the template's strftime_now)
//             With tools (the released 3.1 / 3.2 / 3.3 templates): "Environment: ipython\n" first in
//             the system header; the tool instructions and each tool (json.dumps indent 4) before the
//             first user message's content (trimmed); a reply's one tool call as
//             {"name": NAME, "parameters": ARGUMENTS} (its text dropped, as the template drops it);
//             tool results as "ipython" turns holding the content as a JSON string
//   qwen2.5   ChatML with a default system message when the chat has none — Qwen2.5's, or the one
//             the model's template holds (Qwen2 / Qwen1.5: "You are a helpful assistant."):
//             <|im_start|>ROLE\n CONTENT <|im_end|>\n
//   qwen3     Qwen3: ChatML without a default system message; a reply's "<think>...</think>" is
//             split off as its reasoning and rendered as "<think>\nREASONING\n</think>\n\n" before
//             the content for the replies after the last user turn (always for the last message),
//             dropped for earlier ones
//   chatml    ChatML without a default system message
//   mistral   Mistral v0.3 / Mistral-Small: <s>, user turns [INST] CONTENT[/INST] (the system
//             message goes before the last user turn's content, so a chat that ends with a
//             reply does not show it), replies " CONTENT(trimmed)</s>"
//   mistral-system-first  mistral with the system message before the first user turn's content
//             (the v0.3 template as some releases ship it: `loop.first`)
//   mistral-v0.2  Mistral 7B Instruct v0.2: <s>, user turns " [INST] CONTENT [/INST]" (the system
//             message before the first user turn's content), replies " CONTENT</s>" (untrimmed)
//   mistral-v0.1  Mistral 7B Instruct v0.1 (first release): <s>, user turns "[INST] CONTENT [/INST]",
//             replies "CONTENT</s> " (the space after </s> is not trained); no system message
//   mistral-nemo  Mistral Nemo Instruct 2407: <s>, user turns "[INST]CONTENT[/INST]" (the system
//             message before the last user turn's content, as mistral), replies "CONTENT</s>" as written;
//             with tools (its released template), "[AVAILABLE_TOOLS][...][/AVAILABLE_TOOLS]" before the
//             last user turn, "[TOOL_CALLS][calls with their ids]</s>" replies (text dropped) and
//             "[TOOL_RESULTS]{"content": ..., "call_id": ...}[/TOOL_RESULTS]" results
//   devstral  Devstral Small 2507 (Unsloth's release): <s>, "[SYSTEM_PROMPT]" + the chat's first
//             message if it is a system message, else the template's default one +
//             "[/SYSTEM_PROMPT]", then every message in order: "[INST]CONTENT[/INST]",
//             "[SYSTEM_PROMPT]CONTENT[/SYSTEM_PROMPT]", replies "CONTENT</s>" as written
//   mistral-tekken  mistral-common's template for a Tekken v3 vocabulary (what transformers attaches
//             when it converts Mistral Nemo's tekken.json): <s>, the chat without its system
//             messages, consecutive messages of one role merged ("\n\n"), user turns
//             "[INST]CONTENT[/INST]" (the system messages, joined, before the last one's content),
//             replies "CONTENT</s>" as written
//   deepseek-r1  DeepSeek-R1's distilled models (Llama and Qwen2 based): bos_token, the last
//             system message, user turns "<｜User｜>CONTENT", replies "<｜Assistant｜>" + the
//             content after its last "</think>" (reasoning dropped, as the template drops it) +
//             "<｜end▁of▁sentence｜>"; the prompt to answer ends "<｜Assistant｜><think>\n"
//   qwq       QwQ-32B: ChatML without a default system message; replies before the chat's last
//             message lose their reasoning (the content after the last "</think>", leading newlines
//             dropped); the prompt to answer ends "<|im_start|>assistant\n<think>\n"
// A reply's trained span is what the template adds for it after the role header: its content
// and end-of-turn token (and ChatML's "\n" after it); everything else is masked unless
// train_on_prompt.
#pragma once
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace ptrain {

class Tokenizer;

// A reply's call of a tool: the function's name and its arguments as the template's `tojson`
// renders them (python_json: an object, or a string as given).
struct ToolCall {
  std::string name;
  std::string arguments;
  std::optional<std::string> text = std::nullopt;  // arguments given as a string: it (Qwen3 renders it as is)
  bool in_function = false;   // given inside "function" (OpenAI's form), the only one Llama 3.1's and Nemo's read
  std::string function_json;  // in_function: the "function" object as `tojson` renders it
  std::optional<std::string> id = std::nullopt;  // the call's "id" where it is a string (Mistral Nemo renders it)
};

// A chat's tool definitions ("tools"), each as the template's `tojson` renders it (python_json):
// none where the record has none (absent or null); a list, even an empty one, where it has one
// (Llama 3.1's template renders its tool instructions for any list).
using ChatTools = std::optional<std::vector<std::string>>;

struct ChatMessage {
  std::string role;     // system, user, assistant, tool (a tool's result; llama3 also ipython)
  std::string content;  // a reply with tool calls may have none ("", content_null)
  // A reply's reasoning given apart ("reasoning_content"): Qwen3's template renders it as the
  // reply's <think> block instead of splitting the content; every other template is refused it.
  std::optional<std::string> reasoning = std::nullopt;
  // A reply's tool calls ("tool_calls"): rendered only by a format with `tools` (Qwen2.5's
  // and Qwen3's released templates), refused by every other.
  std::vector<ToolCall> tool_calls = {};
  bool content_null = false;                               // a reply with tool calls whose "content" is null or absent
  bool tool_calls_listed = false;                          // "tool_calls" given as a list, even an empty one (not null)
  std::optional<std::string> tool_call_id = std::nullopt;  // a tool result's, where it is a string (Nemo renders it)
};

struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // trained[t]: the loss includes predicting ids[t]
  // Next-token targets for inputs ids[0 .. n-2]: ids[t+1] where trained, else -100.
  std::vector<int64_t> targets() const;
};

// data.chat_template: `automatic` recognizes the template in the tokenizer's directory.
enum class ChatTemplate {
  automatic,
  llama3,
  llama3_1,
  llama3_2,
  qwen2_5,
  qwen3,
  chatml,
  mistral,
  mistral_v0_2,
  mistral_v0_1,
  mistral_system_first,
  deepseek_r1,
  qwq,
  mistral_nemo,
  devstral,
  mistral_tekken
};
const std::vector<std::string>& chat_template_names();  // as data.chat_template spells them, in enum order

struct ChatFormat {
  ChatTemplate kind = ChatTemplate::llama3;
  std::string date;            // llama3.1 / 3.2: the system header's "Today Date"
  std::string default_system;  // qwen2.5 / chatml / devstral: the system message of a chat that has none ("": none)
  std::string bos_token;       // deepseek-r1: the template's bos_token, as the directory's files resolve it
  std::string think_prompt;    // deepseek-r1 / qwq: what the generation prompt adds after the assistant header
  // Renders a chat's tools, tool calls and tool results: the released templates of Qwen2.5, of
  // Qwen3 (its first release), of Llama 3.1 / 3.2 / 3.3 and of Mistral Nemo (their tool branches
  // token for token), or data.chat_template = "qwen2.5", "llama3.1", "llama3.2" or "mistral-nemo".
  // Where false, `no_tools` says why.
  bool tools = false;
  std::string no_tools;
  std::string source;  // how it was chosen, for the log: "data.chat_template", "<dir>/tokenizer_config.json", ...
  // data_chat_format() without a template it can render: why (kind stays `automatic`); a chat
  // rendered with this format throws NoChatTemplate with it.
  std::string unavailable;
};

// A chat met where no template can render it (ChatFormat::unavailable). Never a malformed record:
// data.on_bad_record = "skip" does not skip it.
struct NoChatTemplate : RuntimeError {
  using RuntimeError::RuntimeError;
};

// The tokenizer's document markers {bos, eos} ("" where there is none): Llama 3's
// <|begin_of_text|> / <|end_of_text|>, Qwen's <|endoftext|>, else tokenizer_config.json's
// bos_token / eos_token, else <s> / </s>.
std::pair<std::string, std::string> document_markers(const Tokenizer& tok);

// The chat format for `tok`: the template `requested`, or (automatic) the one the tokenizer's
// directory ships (chat_template.jinja or tokenizer_config.json's chat_template) recognized as
// one above by what it holds (every tag outside tool-call branches, token for token:
// src/tokenizer/chat.cpp's known_templates) — or Llama 3's when the directory has none and the tokenizer has Llama 3's
// header tokens. An unrecognized template, or none where one is needed, throws RuntimeError naming the file and the
// options (a template is never guessed).
ChatFormat chat_format(const Tokenizer& tok, ChatTemplate requested);
// chat_format() for a data file, whose text records need no template (as transformers reads
// none for them): where chat_format() throws, a format whose `unavailable` says why, so that
// only the file's first chat is refused with it.
ChatFormat data_chat_format(const Tokenizer& tok, ChatTemplate requested);

// A chat template's text (read from `where`) recognized as one ptrain renders: the same tags
// outside tool-call branches, token for token (docs/data.md). Throws RuntimeError naming `where`,
// the line and the first difference from the closest known template (in its literals, filters,
// methods and token variables, else the first tag that differs).
struct RecognizedTemplate {
  ChatTemplate kind;
  std::string model;           // "Llama 3.1 / 3.3 Instruct (as released)", ...
  std::string default_system;  // ChatML's / Devstral's, read from the template ("" where it has none)
  std::string think_prompt;    // deepseek-r1 / qwq: the generation prompt after the assistant header
  bool tools = false;          // its tool branches are its family's released ones ptrain renders, token for token
  std::string no_tools;  // else why not, where its family has such a release (Qwen2.5, Qwen3, Llama 3.1 / 3.2, Nemo)
};
RecognizedTemplate recognize_chat_template(const std::string& text, const std::string& where);

// The directory's default chat template as transformers picks it (additional_chat_templates/
// default.jinja, chat_template.jinja, tokenizer_config.json's chat_template); "" when it has none.
// `where` receives the file it came from. Throws RuntimeError where transformers has no default
// (named templates only) or the file is malformed.
std::string default_chat_template(const std::string& dir, std::string& where);

// A conversation as the format's template renders it. Throws RuntimeError for a role the
// template does not take, a conversation it refuses (Mistral: roles must alternate), or a reply
// whose text merges with the template text around it into one token.
//
// `tools`: the chat's tool definitions; a chat with tools, tool calls or tool results is refused by
// a format without `tools`. A reply with tool calls is trained from after its role header
// ("<|im_start|>assistant", "<|start_header_id|>assistant<|end_header_id|>\n\n"; Nemo's from its
// "[TOOL_CALLS]") through its end of turn, as a plain reply; tool results and the tool definitions
// are not trained. Llama 3.1's and Nemo's templates render a reply with tool calls as the calls
// alone (replies_losing_call_text).
Sample render_chat(const Tokenizer& tok, const ChatFormat& format, const std::vector<ChatMessage>& messages,
                   bool train_on_prompt, const ChatTools& tools = std::nullopt);

// How many replies of the conversation lose their reasoning — the text before a "</think>", or a
// Qwen3 reply's reasoning_content — as the format's template renders them: Qwen3's before the last
// user turn, QwQ's before the last message, every DeepSeek-R1 reply; none in other formats, which
// render a reply's text as written. For the dataset report: the template drops it, so ptrain does.
int64_t replies_losing_reasoning(const ChatFormat& format, const std::vector<ChatMessage>& messages);
// How many replies with a tool call lose their text as the format's template renders them: Llama
// 3.1 / 3.2's and Mistral Nemo's render the calls alone. For the dataset report, as above.
int64_t replies_losing_call_text(const ChatFormat& format, const std::vector<ChatMessage>& messages);

// A prompt for the model to answer: the conversation (ending with a user turn or a tool result) followed by the
// template's generation prompt — what apply_chat_template(add_generation_prompt=True) renders:
// Llama 3's "<|start_header_id|>assistant<|end_header_id|>\n\n", ChatML's / Qwen's
// "<|im_start|>assistant\n", nothing for Mistral (its last [/INST] is the cue), DeepSeek-R1's
// "<｜Assistant｜><think>\n" and QwQ's "<|im_start|>assistant\n<think>\n" (each with "</think>"
// where the template closes it).
std::vector<int32_t> render_prompt(const Tokenizer& tok, const ChatFormat& format,
                                   const std::vector<ChatMessage>& messages, const ChatTools& tools = std::nullopt);
// The text a chat renders to, as apply_chat_template(tokenize=False) gives it (with the
// generation prompt when asked, the chat then ending with a user message): the text whose
// encoding render_chat's / render_prompt's ids are.
std::string chat_text(const ChatFormat& format, const std::vector<ChatMessage>& messages, bool generation_prompt,
                      const ChatTools& tools = std::nullopt);
// The token that ends a reply in this format: <|eot_id|>, <|im_end|> or </s>.
std::string end_of_turn(const ChatFormat& format);

}  // namespace ptrain
