// ptrain entry point: parses the command line and calls the subcommand's function in the part
// it belongs to — train (train/trainer.h), check (app/check.h), eval (app/evaluate.h),
// compare (app/compare.h), export (app/export.h), generate (app/generate.h), tokenize
// (app/tokenize.h). Exit codes:
// 0 success, 2 usage/config error, 1 runtime failure.
#include <torch/version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "app/check.h"
#include "app/compare.h"
#include "app/evaluate.h"
#include "app/export.h"
#include "app/export_gguf.h"
#include "app/generate.h"
#include "app/tokenize.h"
#include "common/error.h"
#include "common/suggest.h"
#include "config/config.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "train/trainer.h"

using namespace ptrain;

namespace {

// Every subcommand with the flags it takes: `ptrain --help` and `ptrain CMD --help` print from
// here, and a flag a subcommand does not take is refused (never silently ignored).
struct Flag {
  const char* name;
  const char* value;  // nullptr: a switch
  const char* help;
  bool required = false;
};
struct Command {
  const char* name;
  const char* summary;
  std::vector<Flag> flags;
};

const Flag kConfig{"--config", "FILE", "the TOML config (docs/config.md)", true};
const Flag kSet{"--set", "section.key=value", "override a config key (repeatable; the value is TOML or a bare string)"};

const std::vector<Command>& commands() {
  static const std::vector<Command> k{
      {"train",
       "trains as configured; writes config.resolved.toml, metrics.jsonl, memory.json and checkpoints/step_N/ under "
       "run.output_dir (default runs/<run.name>). `train` may be left out.",
       {kConfig, kSet}},
      {"check",
       "validates the config, prints the resolved config, the precision table and the predicted per-rank memory, "
       "and exits; exit 2 when the config is invalid or does not fit.",
       {kConfig,
        kSet,
        {"--world-size", "N", "plan for N ranks (default 1)"},
        {"--gpu-memory", "GIB", "check the prediction against GPUs of this many GiB"},
        {"--json", nullptr, "print the prediction as JSON (the fields of memory.json)"},
        {"--plan", nullptr,
         "a config meant for another machine: its data files, checkpoints and GPUs are not looked for"}}},
      {"eval",
       "mean loss / perplexity over every consecutive non-overlapping seq_len+1 window of a text or token file, or "
       "over the samples of a JSONL/Parquet dataset (default: data.path), in order.",
       {kConfig,
        kSet,
        {"--checkpoint", "DIR", "a step_N directory to evaluate (default: the config's initial model)"},
        {"--data", "PATH", "the data to score instead of data.path"},
        {"--json", nullptr, "print the result as JSON"}}},
      {"compare",
       "trains each mode (fp32, mixed, bf16, bf16-sr, bf16-kahan, bf16-adam8bit) from the same init on the same data, "
       "over one or more seeds; writes DIR/<mode>[/seed<S>]/metrics.jsonl, summary.md, summary.csv, runs.csv, "
       "loss.svg. Runs already finished in DIR with the same resolved config are not trained again.",
       {kConfig,
        kSet,
        {"--modes", "LIST", "comma-separated modes", true},
        {"--steps", "N", "steps per mode (default training.steps)"},
        {"--seeds", "N", "seeds per mode: run.seed, run.seed + 1, ... (init, data order, rounding bits); default 1"},
        {"--out", "DIR", "output directory (default runs/compare-<run.name>)"}}},
      {"export",
       "writes a Hugging Face model directory of the run's family (config.json + model.safetensors), or for a LoRA "
       "checkpoint the adapters in PEFT's format (adapter_config.json + adapter_model.safetensors); with --gguf, "
       "one GGUF file llama.cpp runs (weights, tokenizer, chat template; a LoRA checkpoint merged) from a "
       "checkpoint or a config's model.hf_path (docs/export.md).",
       {{"--checkpoint", "DIR", "the step_N directory to export"},
        {"--out", "DIR", "the directory to write (Hugging Face / PEFT)"},
        {"--merge", nullptr, "LoRA: write the base with the adapters merged in (float32)"},
        {"--gguf", "FILE", "write one GGUF file instead"},
        {"--gguf-type", "TYPE", "f32, f16 (default), bf16 or q8_0: the matrices' type (norms stay f32)"},
        {"--config", "FILE", "--gguf: the config whose model.hf_path (and tokenizer) to write"}}},
      {"generate",
       "answers prompts with the config's model (model.hf_path, lora.adapter_path, quant.base) or a checkpoint, "
       "on one process with a KV cache: --prompt TEXT, --chat (the chat template; interactive on a terminal), or "
       "--in prompts.jsonl --out answers.jsonl ({\"prompt\"}, {\"messages\"} or {\"ids\"} records). Greedy "
       "unless --temperature > 0; prints prompt and decode tokens/s and the KV cache's size (docs/generate.md).",
       {kConfig,
        kSet,
        {"--checkpoint", "DIR", "a step_N directory (any world size) instead of the config's weights"},
        {"--tokenizer", "DIR", "tokenizer.json or its directory (default: data.tokenizer, else model.hf_path)"},
        {"--prompt", "TEXT", "one prompt (plain text; the chat template with --chat)"},
        {"--chat", nullptr, "render prompts with the chat template; without --prompt / --in, a conversation on stdin"},
        {"--system", "TEXT", "the system message of a chat"},
        {"--in", "FILE.jsonl", "prompts, one record per line"},
        {"--out", "FILE.jsonl", "the answers of --in (each record with ids, text, finish)"},
        {"--max-new-tokens", "N", "at most this many new tokens (default 256)"},
        {"--temperature", "T", "0 is greedy (default); > 0 samples"},
        {"--top-k", "K", "sample among the K most likely tokens (default: all)"},
        {"--top-p", "P", "sample among the most likely tokens whose probability reaches P (default 1)"},
        {"--seed", "S", "the sampling seed (default 0): the same seed draws the same tokens"},
        {"--stop", "TEXT", "stop at this text (repeatable)"}}},
      {"tokenize",
       "converts text to a token file: byte-level, or with --tokenizer an HF tokenizer.json (a .jsonl input holds "
       "{\"text\": ...} documents, each followed by the end-of-text token), with progress and tokens/s "
       "(docs/data.md).",
       {{"--in", "TEXT|FILE.jsonl", "the input", true},
        {"--out", "FILE.bin", "the token file to write", true},
        {"--tokenizer", "DIR", "tokenizer.json or the model directory holding it (default: bytes)"},
        {"--token-bytes", "2|4", "bytes per token id (default 2, or 4 when the vocabulary needs it)"},
        {"--threads", "N", "tokenizer threads (default 1)"},
        {"--chunk-kib", "N",
         "cut a text into chunks of about N KiB for the threads, after a line where the tokenizer gives the "
         "whole text's ids (default 1024)"}}},
  };
  return k;
}

const Command* find_command(const std::string& name) {
  for (const auto& c : commands())
    if (name == c.name) return &c;
  return nullptr;
}

std::string synopsis(const Command& c) {
  std::string out = std::string("ptrain ") + c.name;
  for (const auto& f : c.flags) {
    const std::string flag = f.value ? std::string(f.name) + " " + f.value : std::string(f.name);
    out += f.required ? " " + flag : " [" + flag + "]" + (std::string(f.name) == "--set" ? "..." : "");
  }
  return out;
}

// `text` broken into lines of at most `width` columns, each after `indent` spaces.
std::string wrap(const std::string& text, size_t indent, size_t width = 100) {
  std::istringstream words(text);
  std::string out, line;
  for (std::string w; words >> w;) {
    if (!line.empty() && indent + line.size() + 1 + w.size() > width) {
      out += std::string(indent, ' ') + line + "\n";
      line.clear();
    }
    line += (line.empty() ? "" : " ") + w;
  }
  return out + std::string(indent, ' ') + line + "\n";
}

std::string usage() {
  std::string out = "ptrain — sharded Llama training on LibTorch\n\nusage:\n";
  for (const auto& c : commands()) out += "  " + synopsis(c) + "\n";
  out += "  ptrain --help | --version | --config-reference\n  ptrain COMMAND --help\n\n";
  for (const auto& c : commands()) out += std::string("  ") + c.name + "\n" + wrap(c.summary, 4);
  out += "\nexit codes: 0 success · 2 bad usage or invalid config (every problem listed) · 1 runtime failure\n";
  return out;
}

std::string command_help(const Command& c) {
  std::string out = "usage: " + synopsis(c) + "\n\n" + wrap(c.summary, 0) + "\noptions:\n";
  for (const auto& f : c.flags) {
    std::string lhs = std::string(f.name) + (f.value ? std::string(" ") + f.value : "");
    out += "  " + lhs + std::string(lhs.size() < 28 ? 28 - lhs.size() : 1, ' ') + f.help + "\n";
  }
  out += "  --help                      this text\n";
  return out;
}

struct Args {
  std::string command = "train";
  std::string config;
  std::vector<std::string> sets;
  std::map<std::string, std::string> options;  // --flag value
  bool json = false;
  bool plan = false;
  bool merge = false;
  bool chat = false;
  bool help = false;
  std::vector<std::string> stops;  // --stop, repeatable
};

Args parse_args(int argc, char** argv) {
  Args a;
  int i = 1;
  std::vector<std::string> names;
  for (const auto& c : commands()) names.push_back(c.name);
  if (i < argc && argv[i][0] != '-') {
    a.command = argv[i++];
    if (!find_command(a.command)) {
      const std::string near = closest(a.command, names);
      throw UsageError("unknown command '" + a.command + "'" + (near.empty() ? "" : "; did you mean " + near + "?") +
                       " (see ptrain --help)");
    }
  }
  const Command& command = *find_command(a.command);
  std::vector<std::string> flags;
  for (const auto& f : command.flags) flags.push_back(f.name);
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const auto eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    }
    if (arg == "--help" || arg == "-h") {
      a.help = true;
      continue;
    }
    auto flag = std::find_if(command.flags.begin(), command.flags.end(), [&](const Flag& f) { return arg == f.name; });
    if (flag == command.flags.end()) {
      const std::string near = closest(arg, flags);
      bool other = false;  // a flag of another subcommand
      for (const auto& c : commands())
        for (const auto& f : c.flags) other = other || arg == f.name;
      std::string known;
      for (const auto& f : flags) known += (known.empty() ? "" : ", ") + f;
      throw UsageError((other ? "ptrain " + a.command + " does not take " + arg : "unknown argument '" + arg + "'") +
                       (near.empty() ? "" : "; did you mean " + near + "?") + " (ptrain " + a.command + " takes " +
                       known + "; see ptrain " + a.command + " --help)");
    }
    if (!flag->value) {
      if (eq != std::string::npos) throw UsageError(arg + " takes no value");
      a.json = a.json || arg == "--json";
      a.plan = a.plan || arg == "--plan";
      a.merge = a.merge || arg == "--merge";
      a.chat = a.chat || arg == "--chat";
      continue;
    }
    if (eq == std::string::npos) {
      if (i + 1 >= argc) throw UsageError(arg + " needs a value (" + flag->value + ")");
      value = argv[++i];
    }
    if (arg == "--config")
      a.config = value;
    else if (arg == "--set")
      a.sets.push_back(value);
    else if (arg == "--stop")
      a.stops.push_back(value);
    else
      a.options[arg] = value;
  }
  return a;
}

int64_t int_option(const Args& a, const std::string& name, int64_t fallback, int64_t min) {
  auto it = a.options.find(name);
  if (it == a.options.end()) return fallback;
  try {
    size_t used = 0;
    const int64_t v = std::stoll(it->second, &used);
    if (used == it->second.size() && v >= min) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(name + " must be an integer >= " + std::to_string(min) + " (got '" + it->second + "')");
}

std::string required(const Args& a, const std::string& name) {
  auto it = a.options.find(name);
  if (it == a.options.end()) throw UsageError("ptrain " + a.command + " needs " + name);
  return it->second;
}

Config config_of(const Args& a) {
  if (a.config.empty()) throw UsageError("ptrain " + a.command + " needs --config FILE");
  return load_config(a.config, a.sets);
}

int cmd_check(const Args& a) {
  CheckRequest r;
  r.config = a.config;
  if (r.config.empty()) throw UsageError("ptrain check needs --config FILE");
  r.sets = a.sets;
  r.world_size = static_cast<int>(int_option(a, "--world-size", 1, 1));
  r.json = a.json;
  r.plan = a.plan;
  if (a.options.count("--gpu-memory")) {
    try {
      r.gpu_memory_gib = std::stod(a.options.at("--gpu-memory"));
    } catch (const std::exception&) {
    }
    if (!(r.gpu_memory_gib > 0))
      throw UsageError("--gpu-memory must be a positive number of GiB (got '" + a.options.at("--gpu-memory") + "')");
  }
  return check(r);
}

int cmd_eval(const Args& a) {
  if (a.config.empty()) throw UsageError("ptrain eval needs --config FILE");
  EvalRequest r{a.config, a.sets, "", "", a.json};
  if (a.options.count("--checkpoint")) r.checkpoint = a.options.at("--checkpoint");
  if (a.options.count("--data")) r.data = a.options.at("--data");
  return run_eval(r);
}

int cmd_export(const Args& a) {
  const auto option = [&](const char* name) { return a.options.count(name) ? a.options.at(name) : std::string(); };
  if (a.options.count("--gguf")) {
    if (a.options.count("--out") || a.merge)
      throw UsageError("export --gguf writes one file: drop --out and --merge (a LoRA checkpoint is merged anyway)");
    return run_export_gguf(option("--checkpoint"), a.config, option("--gguf"),
                           a.options.count("--gguf-type") ? option("--gguf-type") : "f16");
  }
  if (a.options.count("--gguf-type") || !a.config.empty())
    throw UsageError("--gguf-type and --config go with --gguf FILE");
  return run_export(required(a, "--checkpoint"), required(a, "--out"), a.merge);
}

int cmd_compare(const Args& a) {
  if (a.config.empty()) throw UsageError("ptrain compare needs --config FILE");
  CompareOptions o;
  o.config_path = a.config;
  o.overrides = a.sets;
  std::stringstream modes(required(a, "--modes"));
  for (std::string m; std::getline(modes, m, ',');)
    if (!m.empty()) o.modes.push_back(m);
  o.steps = int_option(a, "--steps", 0, 1);
  o.seeds = static_cast<int>(int_option(a, "--seeds", 1, 1));
  if (a.options.count("--out")) o.out_dir = a.options.at("--out");
  return compare(o);
}

double real_option(const Args& a, const std::string& name, double fallback) {
  auto it = a.options.find(name);
  if (it == a.options.end()) return fallback;
  try {
    size_t used = 0;
    const double v = std::stod(it->second, &used);
    if (used == it->second.size() && std::isfinite(v)) return v;
  } catch (const std::exception&) {
  }
  throw UsageError(name + " must be a number (got '" + it->second + "')");
}

int cmd_generate(const Args& a) {
  if (a.config.empty()) throw UsageError("ptrain generate needs --config FILE");
  GenerateRequest r;
  r.config = a.config;
  r.sets = a.sets;
  const auto text = [&](const char* name) { return a.options.count(name) ? a.options.at(name) : std::string(); };
  r.checkpoint = text("--checkpoint");
  r.tokenizer = text("--tokenizer");
  r.prompt = text("--prompt");
  r.chat = a.chat;
  r.system = text("--system");
  r.in = text("--in");
  r.out = text("--out");
  if (a.options.count("--prompt") && r.prompt.empty()) throw UsageError("--prompt needs a non-empty text");
  r.sampling.max_new_tokens = int_option(a, "--max-new-tokens", 256, 1);
  r.sampling.temperature = real_option(a, "--temperature", 0.0);
  r.sampling.top_k = int_option(a, "--top-k", 0, 0);
  r.sampling.top_p = real_option(a, "--top-p", 1.0);
  r.sampling.seed = static_cast<uint64_t>(int_option(a, "--seed", 0, 0));
  r.sampling.stop = a.stops;
  return run_generate(r);
}

int cmd_tokenize(const Args& a) {
  TokenizeRequest r;
  r.in = required(a, "--in");
  r.out = required(a, "--out");
  if (a.options.count("--tokenizer")) r.tokenizer = a.options.at("--tokenizer");
  r.token_bytes = int_option(a, "--token-bytes", 0, 2);
  r.threads = static_cast<int>(int_option(a, "--threads", 1, 1));
  r.chunk_kib = int_option(a, "--chunk-kib", 1024, 1);
  if (r.chunk_kib > (int64_t{1} << 30)) throw UsageError("--chunk-kib must be at most 1073741824 (1 TiB)");
  if (r.token_bytes != 0 && r.token_bytes != 2 && r.token_bytes != 4) throw UsageError("--token-bytes must be 2 or 4");
  return run_tokenize(r);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 &&
        (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help"))) {
      std::cout << usage();
      return 0;
    }
    if (argc >= 2 && !std::strcmp(argv[1], "--config-reference")) {  // docs/config.md, from the key table
      std::cout << config_reference();
      return 0;
    }
    if (argc >= 2 && !std::strcmp(argv[1], "--version")) {
      std::cout << "ptrain " << PTRAIN_VERSION << " (LibTorch " << TORCH_VERSION << ")\n";
      return 0;
    }
    if (argc < 2) {
      std::cerr << usage();
      return 2;
    }
    Args a = parse_args(argc, argv);
    if (a.help) {
      std::cout << command_help(*find_command(a.command));
      return 0;
    }
    if (a.command == "train") return train(config_of(a));
    if (a.command == "check") return cmd_check(a);
    if (a.command == "eval") return cmd_eval(a);
    if (a.command == "export") return cmd_export(a);
    if (a.command == "tokenize") return cmd_tokenize(a);
    if (a.command == "compare") return cmd_compare(a);
    if (a.command == "generate") return cmd_generate(a);
    throw UsageError("'ptrain " + a.command + "' is not implemented in ptrain " PTRAIN_VERSION);
  } catch (const UsageError& e) {
    std::cerr << "error: " << e.what() << "\n";
    return 2;
  } catch (const ConfigError& e) {
    std::cerr << e.what() << "invalid config: " << e.problems.size() << " problem(s); nothing was started\n";
    return 2;
  } catch (const std::exception& e) {
    // RuntimeError, c10::Error and I/O errors: say what failed; checkpoints already written stay intact.
    std::string what = e.what();
    if (auto* ce = dynamic_cast<const c10::Error*>(&e)) what = ce->what_without_backtrace();
    DistEnv env;
    try {
      env = DistEnv::detect();
    } catch (const std::exception&) {
    }
    if (env.world_size > 1) {
      // The other ranks would wait in their next collective: take the whole job down.
      std::cerr << "error: rank " << env.rank << " of " << env.world_size << ": " << what << "\n" << std::flush;
      mpi_abort(1);
    }
    std::cerr << "error: " << what << "\n";
    return 1;
  }
}
