#include "app/generate.h"

#include <ATen/ATen.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "data/samples.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/decode.h"
#include "train/setup.h"

namespace ptrain {

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;  // records keep their key order (tool arguments), answers too

namespace {

std::string per_second(double n, double seconds) { return seconds > 0 ? log::grouped(n / seconds) + " tokens/s" : "-"; }

void report(const Completion& c) {
  log::info("prompt ", c.prompt_tokens, " tokens in ", log::fixed(c.prompt_seconds, 3), " s (",
            per_second(static_cast<double>(c.prompt_tokens), c.prompt_seconds), ") | ", c.ids.size(),
            " new tokens, decoded in ", log::fixed(c.decode_seconds, 3), " s after the first (",
            per_second(static_cast<double>(c.ids.size()) - 1, c.decode_seconds), ") | KV cache ",
            log::bytes(static_cast<double>(c.cache_bytes)), " | finished: ", c.finish);
}

void check_request(const GenerateRequest& r) {
  if (DistEnv::detect().world_size > 1)
    throw UsageError("ptrain generate runs as one process; start it without mpirun");
  if (!r.prompt.empty() && !r.in.empty()) throw UsageError("--prompt and --in: give one or the other");
  if (!r.in.empty() && r.out.empty()) throw UsageError("--in needs --out (the answers' JSONL file)");
  if (r.in.empty() && !r.out.empty()) throw UsageError("--out goes with --in");
  if (r.prompt.empty() && r.in.empty() && !r.chat)
    throw UsageError("what to answer: --prompt TEXT, --chat (interactive), or --in prompts.jsonl --out answers.jsonl");
  if (!r.system.empty() && !r.chat && r.in.empty()) throw UsageError("--system goes with --chat or --in");
  const SamplingOptions& o = r.sampling;
  if (o.temperature < 0) throw UsageError("--temperature must be >= 0 (0: greedy)");
  if (!(o.top_p > 0 && o.top_p <= 1)) throw UsageError("--top-p must be in (0, 1]");
  if (o.temperature == 0 && (o.top_k > 0 || o.top_p < 1))
    throw UsageError("--top-k / --top-p sample: give a --temperature > 0 with them (0 is greedy)");
  for (const auto& s : o.stop)
    if (s.empty()) throw UsageError("--stop needs a non-empty string");
}

// One generate run: the config, the tokenizer and chat format (read when first needed: an
// ids-only batch needs neither), the model, the ids that stop a completion.
class Session {
 public:
  explicit Session(const GenerateRequest& r) : r_(r), c_(load_config(r.config, r.sets)) {
    const std::string path = r.tokenizer.empty() ? c_.tokenizer_path() : r.tokenizer;
    try {
      if (path.empty()) throw RuntimeError("no --tokenizer, data.tokenizer or model.hf_path is given");
      tok_ = std::make_unique<Tokenizer>(path);
    } catch (const RuntimeError& e) {
      no_tokenizer_ = e.what();
    }
    if (!r.prompt.empty()) tokenizer();  // (before the model loads: a usage error costs nothing)
    if (r.chat) chat_format_of();
    load_model();
  }

  const Tokenizer& tokenizer() const {
    if (!tok_) throw UsageError("text prompts need the model's tokenizer: " + no_tokenizer_);
    return *tok_;
  }
  const ChatFormat& chat_format_of() {
    if (!format_) {
      try {
        format_ = chat_format(tokenizer(), c_.data.chat_template);
      } catch (const RuntimeError& e) {
        throw UsageError(std::string("no chat template to render the prompt with: ") + e.what());
      }
    }
    return *format_;
  }
  // A plain prompt as the tokenizer alone encodes it (its post-processor's special tokens).
  std::vector<int32_t> plain_prompt(const std::string& text) const {
    return tokenizer().encode_with_special_tokens(text);
  }
  std::vector<int32_t> chat_prompt(const std::vector<ChatMessage>& messages, const ChatTools& tools = std::nullopt) {
    return render_prompt(tokenizer(), chat_format_of(), messages, tools);
  }
  Completion complete(const std::vector<int32_t>& prompt, const SamplingOptions& o, const Tokenizer* tok,
                      const std::function<void(const std::string&)>& stream = {}) {
    return ptrain::complete(*model_, prompt, eos_, o, tok, stream);
  }
  // A record of --in: {"prompt": text}, {"messages": chat, and its "tools"} or {"ids": [...]}; `line`
  // is its JSON text.
  std::vector<int32_t> record_prompt(const ojson& record, const std::string& line) {
    if (!record.is_object()) throw RuntimeError("a record must be a JSON object");
    const int kinds = static_cast<int>(record.contains("ids")) + static_cast<int>(record.contains("messages")) +
                      static_cast<int>(record.contains("prompt"));
    if (kinds > 1) throw RuntimeError("a record holds one of \"prompt\", \"messages\" and \"ids\", not several");
    if (record.contains("tools") && !record["tools"].is_null() && !record.contains("messages"))
      throw RuntimeError(
          "\"tools\" go with a \"messages\" chat, whose template renders them; a \"prompt\" text or "
          "\"ids\" cannot hold them");
    if (record.contains("ids")) {
      std::vector<int32_t> prompt;
      const int64_t vocab = c_.model.shape.vocab_size;
      for (const auto& v : record["ids"]) {
        if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
          throw RuntimeError("\"ids\" must be token ids in [0, " + std::to_string(vocab) + ")");
        prompt.push_back(v.get<int32_t>());
      }
      return prompt;
    }
    if (record.contains("messages")) {
      std::vector<ChatMessage> messages = chat_turns(record["messages"]);
      if (!r_.system.empty() && messages.front().role != "system")
        messages.insert(messages.begin(), {"system", r_.system});
      return chat_prompt(messages, chat_tools(record, line));  // the tools the chat's template renders
    }
    if (record.contains("prompt") && record["prompt"].is_string())
      return plain_prompt(record["prompt"].get<std::string>());
    throw RuntimeError("a record needs \"prompt\" (text), \"messages\" (a chat) or \"ids\"");
  }
  const Tokenizer* tokenizer_if_any() const { return tok_.get(); }
  const std::vector<int32_t>& eos() const { return eos_; }

 private:
  void load_model() {
    const SamplingOptions& o = r_.sampling;
    const DistEnv single;
    const c10::Device device = resolve_device(c_, single);
    model_ = build_model(c_, device, make_collectives(single, Backend::automatic, device, c_.parallel.timeout_s));
    std::string source = c_.model.hf_path.empty() ? "init(seed=" + std::to_string(c_.run.seed) + ")" : c_.model.hf_path;
    if (!c_.lora.adapter_path.empty()) source += " + adapters " + c_.lora.adapter_path;
    if (!r_.checkpoint.empty()) {
      TrainProgress progress;
      load_checkpoint(r_.checkpoint, *model_, nullptr, progress);
      source = r_.checkpoint + " (step " + std::to_string(progress.step) + ")";
    }
    warn_generation_settings_left(c_, o);
    eos_ = eos_ids(c_, tok_.get(), format_ ? &*format_ : nullptr);
    std::string eos_text;
    for (int32_t id : eos_) eos_text += (eos_text.empty() ? "" : ", ") + std::to_string(id);
    log::info("generating with ", source, " on ", device.str(), " (", name_of(c_.precision.mode), ") | stops at ids [",
              eos_text, "]", o.temperature > 0 ? " | sampling, seed " + std::to_string(o.seed) : " | greedy");
  }

  const GenerateRequest& r_;
  const Config c_;
  std::unique_ptr<Tokenizer> tok_;
  std::string no_tokenizer_;  // why there is no tokenizer
  std::optional<ChatFormat> format_;
  std::unique_ptr<FsdpModel> model_;
  std::vector<int32_t> eos_;
};

void stream_piece(const std::string& piece) { std::cout << piece << std::flush; }

// --in / --out: one answer per record, in order.
void answer_file(const GenerateRequest& r, Session& session) {
  std::ifstream in(r.in);
  if (!in) throw UsageError("cannot open --in '" + r.in + "'");
  std::vector<std::string> answers;
  int64_t line = 0;
  for (std::string text; std::getline(in, text);) {
    ++line;
    if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
    ojson record;
    std::vector<int32_t> prompt;
    try {
      record = ojson::parse(text);
      prompt = session.record_prompt(record, text);
    } catch (const ojson::exception& e) {
      throw UsageError(r.in + ":" + std::to_string(line) + ": not valid JSON (" + e.what() + ")");
    } catch (const RuntimeError& e) {
      throw UsageError(r.in + ":" + std::to_string(line) + ": " + e.what());
    }
    const Tokenizer* tok = session.tokenizer_if_any();
    const bool text_out = !record.contains("ids") || tok;
    const Completion done = session.complete(prompt, r.sampling, text_out ? tok : nullptr);
    report(done);
    ojson answer = record;
    answer["prompt_ids"] = prompt;
    answer["ids"] = done.ids;
    if (text_out && tok) answer["text"] = done.text;
    answer["finish"] = done.finish;
    answer["eos"] = session.eos();
    answers.push_back(answer.dump());
  }
  std::string all;
  for (const auto& a : answers) all += a + "\n";
  write_file_atomic(r.out, all);
  log::info("wrote ", answers.size(), " answers to ", r.out);
}

// --prompt: one answer, streamed (with --chat, the prompt rendered as a user turn).
void answer_prompt(const GenerateRequest& r, Session& session) {
  std::vector<ChatMessage> turn{{"user", r.prompt}};
  if (!r.system.empty()) turn.insert(turn.begin(), {"system", r.system});
  const std::vector<int32_t> prompt = r.chat ? session.chat_prompt(turn) : session.plain_prompt(r.prompt);
  const Completion done = session.complete(prompt, r.sampling, &session.tokenizer(), stream_piece);
  std::cout << "\n";
  report(done);
}

// Interactive chat: each line a user turn; the conversation is kept. An empty line or the end
// of input ends it.
void chat(const GenerateRequest& r, Session& session) {
  std::vector<ChatMessage> messages;
  if (!r.system.empty()) messages.push_back({"system", r.system});
  const bool terminal = ::isatty(STDIN_FILENO);
  SamplingOptions turn = r.sampling;
  for (;;) {
    if (terminal) std::cout << "> " << std::flush;
    std::string line;
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({"user", line});
    const Completion done = session.complete(session.chat_prompt(messages), turn, &session.tokenizer(), stream_piece);
    std::cout << "\n";
    report(done);
    messages.push_back({"assistant", done.text});
    ++turn.seed;  // each turn its own draw
  }
}

}  // namespace

int run_generate(const GenerateRequest& r) {
  check_request(r);
  Session session(r);
  if (!r.in.empty())
    answer_file(r, session);
  else if (!r.prompt.empty())
    answer_prompt(r, session);
  else
    chat(r, session);
  return 0;
}

}  // namespace ptrain
