// ptrain entry point: parses the command line and calls the subcommand's function in the part
// it belongs to — train (train/trainer.h), check (train/check.h), eval (train/evaluate.h),
// compare (train/compare.h), export (train/export.h), tokenize (data/tokenize.h). Exit codes:
// 0 success, 2 usage/config error, 1 runtime failure.
#include <torch/version.h>

#include <cstring>
#include <iostream>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "common/error.h"
#include "config/config.h"
#include "data/tokenize.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "train/check.h"
#include "train/compare.h"
#include "train/evaluate.h"
#include "train/export.h"
#include "train/trainer.h"

using namespace ptrain;

namespace {

constexpr const char* kUsage = R"(ptrain — sharded Llama training on LibTorch

usage:
  ptrain [train] --config FILE [--set section.key=value]...
  ptrain check   --config FILE [--set ...] [--world-size N] [--gpu-memory GIB] [--json] [--plan]
  ptrain eval    --config FILE [--set ...] [--checkpoint DIR] [--data PATH] [--json]
  ptrain compare --config FILE --modes LIST [--steps N] [--out DIR] [--set ...]
  ptrain export  --checkpoint DIR --out DIR [--merge]
  ptrain tokenize --in TEXT|FILE.jsonl --out FILE.bin [--tokenizer DIR] [--token-bytes 2|4] [--threads N]
  ptrain --help | --version | --config-reference

  train     trains as configured; writes config.resolved.toml, metrics.jsonl, memory.json and
            checkpoints/step_N/ under run.output_dir (default runs/<run.name>)
  check     validates the config, prints the resolved config, the precision table and the
            predicted per-rank memory, and exits; --plan checks a config meant for another
            machine (its data files, checkpoints and GPUs are not looked for here)
  eval      mean loss / perplexity over every consecutive non-overlapping seq_len+1 window of
            a text or token file (default: data.path), in order
  compare   trains each mode (fp32, mixed, bf16, bf16-sr, bf16-adam8bit) from the same init on the
            same data; writes DIR/<mode>/metrics.jsonl, summary.md, summary.csv, loss.svg
  export    writes a Hugging Face model directory of the run's family (config.json + model.safetensors), or for a
            LoRA checkpoint the adapters in PEFT's format (adapter_config.json +
            adapter_model.safetensors); --merge writes the base with the adapters merged in
  tokenize  converts text to a token file: byte-level, or with --tokenizer an HF tokenizer.json
            (byte-level BPE, e.g. Llama 3's; a .jsonl input holds {"text": ...} documents, each
            followed by <|end_of_text|>), with progress and tokens/s (see docs/data.md)

exit codes: 0 success · 2 bad usage or invalid config (every problem listed) · 1 runtime failure
)";

struct Args {
  std::string command = "train";
  std::string config;
  std::vector<std::string> sets;
  std::map<std::string, std::string> options;  // --flag value
  bool json = false;
  bool plan = false;
  bool merge = false;
};

Args parse_args(int argc, char** argv) {
  Args a;
  int i = 1;
  static const std::vector<std::string> commands{"train", "check", "eval", "export", "tokenize", "compare"};
  if (i < argc && argv[i][0] != '-') {
    a.command = argv[i++];
    if (std::find(commands.begin(), commands.end(), a.command) == commands.end())
      throw UsageError("unknown command '" + a.command + "' (see ptrain --help)");
  }
  static const std::vector<std::string> valued{
      "--config", "--set",         "--world-size", "--gpu-memory", "--checkpoint", "--data",   "--out",
      "--in",     "--token-bytes", "--modes",      "--steps",      "--tokenizer",  "--threads"};
  for (; i < argc; ++i) {
    std::string arg = argv[i];
    std::string value;
    const auto eq = arg.find('=');
    if (arg.rfind("--", 0) == 0 && eq != std::string::npos && arg.substr(0, eq) != "--set") {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (arg.rfind("--set=", 0) == 0) {
      value = arg.substr(6);
      arg = "--set";
    }
    if (arg == "--json") {
      a.json = true;
    } else if (arg == "--plan") {
      a.plan = true;
    } else if (arg == "--merge") {
      a.merge = true;
    } else if (std::find(valued.begin(), valued.end(), arg) != valued.end()) {
      if (value.empty()) {
        if (i + 1 >= argc) throw UsageError(arg + " needs a value");
        value = argv[++i];
      }
      if (arg == "--config")
        a.config = value;
      else if (arg == "--set")
        a.sets.push_back(value);
      else
        a.options[arg] = value;
    } else {
      throw UsageError("unknown argument '" + arg + "' (see ptrain --help)");
    }
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

int cmd_export(const Args& a) { return run_export(required(a, "--checkpoint"), required(a, "--out"), a.merge); }

int cmd_compare(const Args& a) {
  if (a.config.empty()) throw UsageError("ptrain compare needs --config FILE");
  CompareOptions o;
  o.config_path = a.config;
  o.overrides = a.sets;
  std::stringstream modes(required(a, "--modes"));
  for (std::string m; std::getline(modes, m, ',');)
    if (!m.empty()) o.modes.push_back(m);
  o.steps = int_option(a, "--steps", 0, 1);
  if (a.options.count("--out")) o.out_dir = a.options.at("--out");
  return compare(o);
}

int cmd_tokenize(const Args& a) {
  TokenizeRequest r;
  r.in = required(a, "--in");
  r.out = required(a, "--out");
  if (a.options.count("--tokenizer")) r.tokenizer = a.options.at("--tokenizer");
  r.token_bytes = int_option(a, "--token-bytes", 0, 2);
  r.threads = static_cast<int>(int_option(a, "--threads", 1, 1));
  if (r.token_bytes != 0 && r.token_bytes != 2 && r.token_bytes != 4) throw UsageError("--token-bytes must be 2 or 4");
  return run_tokenize(r);
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 &&
        (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help"))) {
      std::cout << kUsage;
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
      std::cerr << kUsage;
      return 2;
    }
    Args a = parse_args(argc, argv);
    if (a.command == "train") return train(config_of(a));
    if (a.command == "check") return cmd_check(a);
    if (a.command == "eval") return cmd_eval(a);
    if (a.command == "export") return cmd_export(a);
    if (a.command == "tokenize") return cmd_tokenize(a);
    if (a.command == "compare") return cmd_compare(a);
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
