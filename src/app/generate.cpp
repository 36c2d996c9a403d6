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
using nlohmann::json;

namespace {

std::string per_second(double n, double seconds) { return seconds > 0 ? log::grouped(n / seconds) + " tokens/s" : "-"; }

void report(const Completion& c) {
  log::info("prompt ", c.prompt_tokens, " tokens in ", log::fixed(c.prompt_seconds, 3), " s (",
            per_second(static_cast<double>(c.prompt_tokens), c.prompt_seconds), ") | ", c.ids.size(),
            " new tokens, decoded in ", log::fixed(c.decode_seconds, 3), " s after the first (",
            per_second(static_cast<double>(c.ids.size()) - 1, c.decode_seconds), ") | KV cache ",
            log::bytes(static_cast<double>(c.cache_bytes)), " | finished: ", c.finish);
}

}  // namespace

int run_generate(const GenerateRequest& r) {
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

  const Config c = load_config(r.config, r.sets);
  // The tokenizer, when there is one (an ids-only batch needs none).
  std::unique_ptr<Tokenizer> tok;
  std::string no_tokenizer;
  const std::string tok_path = r.tokenizer.empty() ? c.tokenizer_path() : r.tokenizer;
  try {
    if (tok_path.empty()) throw RuntimeError("no --tokenizer, data.tokenizer or model.hf_path is given");
    tok = std::make_unique<Tokenizer>(tok_path);
  } catch (const RuntimeError& e) {
    no_tokenizer = e.what();
  }
  const auto tokenizer = [&]() -> const Tokenizer& {
    if (!tok) throw UsageError("text prompts need the model's tokenizer: " + no_tokenizer);
    return *tok;
  };
  std::optional<ChatFormat> format;
  const auto chat_format_of = [&]() -> const ChatFormat& {
    if (!format) {
      try {
        format = chat_format(tokenizer(), c.data.chat_template);
      } catch (const RuntimeError& e) {
        throw UsageError(std::string("no chat template to render the prompt with: ") + e.what());
      }
    }
    return *format;
  };
  if (!r.prompt.empty()) tokenizer();  // (before the model loads: a usage error costs nothing)
  if (r.chat) chat_format_of();

  const DistEnv single;
  const c10::Device device = resolve_device(c, single);
  auto model = build_model(c, device, make_collectives(single, Backend::automatic, device, c.parallel.timeout_s));
  std::string source = c.model.hf_path.empty() ? "init(seed=" + std::to_string(c.run.seed) + ")" : c.model.hf_path;
  if (!c.lora.adapter_path.empty()) source += " + adapters " + c.lora.adapter_path;
  if (!r.checkpoint.empty()) {
    TrainProgress progress;
    load_checkpoint(r.checkpoint, *model, nullptr, progress);
    source = r.checkpoint + " (step " + std::to_string(progress.step) + ")";
  }
  warn_generation_settings_left(c, o);
  const std::vector<int32_t> eos = eos_ids(c, tok.get(), format ? &*format : nullptr);
  std::string eos_text;
  for (int32_t id : eos) eos_text += (eos_text.empty() ? "" : ", ") + std::to_string(id);
  log::info("generating with ", source, " on ", device.str(), " (", name_of(c.precision.mode), ") | stops at ids [",
            eos_text, "]", o.temperature > 0 ? " | sampling, seed " + std::to_string(o.seed) : " | greedy");

  // A plain prompt as the tokenizer alone encodes it (its post-processor's special tokens).
  const auto plain_prompt = [&](const std::string& text) { return tokenizer().encode_with_special_tokens(text); };
  const auto stream = [](const std::string& piece) { std::cout << piece << std::flush; };

  if (!r.in.empty()) {  // a batch: one answer per record, in order
    std::ifstream in(r.in);
    if (!in) throw UsageError("cannot open --in '" + r.in + "'");
    std::vector<std::string> answers;
    int64_t line = 0;
    for (std::string text; std::getline(in, text);) {
      ++line;
      if (text.find_first_not_of(" \t\r") == std::string::npos) continue;
      json record, answer;
      std::vector<int32_t> prompt;
      try {
        record = json::parse(text);
        if (!record.is_object()) throw RuntimeError("a record must be a JSON object");
        const int kinds = static_cast<int>(record.contains("ids")) + static_cast<int>(record.contains("messages")) +
                          static_cast<int>(record.contains("prompt"));
        if (kinds > 1) throw RuntimeError("a record holds one of \"prompt\", \"messages\" and \"ids\", not several");
        if (record.contains("ids")) {
          for (const auto& v : record["ids"]) {
            if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= c.model.shape.vocab_size)
              throw RuntimeError("\"ids\" must be token ids in [0, " + std::to_string(c.model.shape.vocab_size) + ")");
            prompt.push_back(v.get<int32_t>());
          }
        } else if (record.contains("messages")) {
          std::vector<ChatMessage> messages = chat_turns(record["messages"]);
          if (!r.system.empty() && messages.front().role != "system")
            messages.insert(messages.begin(), {"system", r.system});
          prompt = render_prompt(tokenizer(), chat_format_of(), messages);
        } else if (record.contains("prompt") && record["prompt"].is_string()) {
          prompt = plain_prompt(record["prompt"].get<std::string>());
        } else {
          throw RuntimeError("a record needs \"prompt\" (text), \"messages\" (a chat) or \"ids\"");
        }
      } catch (const json::exception& e) {
        throw UsageError(r.in + ":" + std::to_string(line) + ": not valid JSON (" + e.what() + ")");
      } catch (const RuntimeError& e) {
        throw UsageError(r.in + ":" + std::to_string(line) + ": " + e.what());
      }
      const bool text_out = !record.contains("ids") || tok;
      const Completion done = complete(*model, prompt, eos, o, text_out ? tok.get() : nullptr);
      report(done);
      answer = record;
      answer["prompt_ids"] = prompt;
      answer["ids"] = done.ids;
      if (text_out && tok) answer["text"] = done.text;
      answer["finish"] = done.finish;
      answer["eos"] = eos;
      answers.push_back(answer.dump());
    }
    std::string all;
    for (const auto& a : answers) all += a + "\n";
    write_file_atomic(r.out, all);
    log::info("wrote ", answers.size(), " answers to ", r.out);
    return 0;
  }
  if (!r.prompt.empty()) {
    const std::vector<int32_t> prompt =
        r.chat ? render_prompt(tokenizer(), chat_format_of(),
                               r.system.empty() ? std::vector<ChatMessage>{{"user", r.prompt}}
                                                : std::vector<ChatMessage>{{"system", r.system}, {"user", r.prompt}})
               : plain_prompt(r.prompt);
    const Completion done = complete(*model, prompt, eos, o, &tokenizer(), stream);
    std::cout << "\n";
    report(done);
    return 0;
  }
  // Interactive chat: each line a user turn; the conversation is kept. An empty line or the end
  // of input ends it.
  std::vector<ChatMessage> messages;
  if (!r.system.empty()) messages.push_back({"system", r.system});
  const bool terminal = ::isatty(STDIN_FILENO);
  SamplingOptions turn = o;
  for (;;) {
    if (terminal) std::cout << "> " << std::flush;
    std::string line;
    if (!std::getline(std::cin, line) || line.empty()) break;
    messages.push_back({"user", line});
    const Completion done =
        complete(*model, render_prompt(tokenizer(), chat_format_of(), messages), eos, turn, &tokenizer(), stream);
    std::cout << "\n";
    report(done);
    messages.push_back({"assistant", done.text});
    ++turn.seed;  // each turn its own draw
  }
  return 0;
}

}  // namespace ptrain
