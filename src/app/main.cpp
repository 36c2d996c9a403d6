// ptrain entry point: parses the command line and dispatches to train | check | eval |
// export | tokenize. Exit codes: 0 success, 2 usage/config error, 1 runtime failure.
#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <torch/version.h>

#include <chrono>
#include <cstring>
#include <fstream>
#include <filesystem>
#include <iostream>
#include <sstream>
#include <nlohmann/json.hpp>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "data/rows.h"
#include "data/token_file.h"
#include "data/tokenizer.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "parallel/precision.h"
#include "train/compare.h"
#include "train/memory.h"
#include "train/export.h"
#include "train/setup.h"
#include "train/trainer.h"

namespace fs = std::filesystem;
using namespace ptrain;

namespace {

constexpr const char* kUsage = R"(ptrain — sharded Llama training on LibTorch

usage:
  ptrain [train] --config FILE [--set section.key=value]...
  ptrain check   --config FILE [--set ...] [--world-size N] [--gpu-memory GIB] [--json] [--plan]
  ptrain eval    --config FILE [--set ...] [--checkpoint DIR] [--data PATH] [--json]
  ptrain compare --config FILE --modes LIST [--steps N] [--out DIR] [--set ...]
  ptrain export  --checkpoint DIR --out DIR [--merge]
  ptrain tokenize --in TEXT|FILE.jsonl --out FILE.bin [--tokenizer DIR] [--token-bytes 2|4]
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
  static const std::vector<std::string> valued{"--config", "--set", "--world-size", "--gpu-memory", "--checkpoint",
                                                 "--data", "--out", "--in", "--token-bytes", "--modes", "--steps", "--tokenizer"};
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
  Environment env = Environment::detect();
  env.local = !a.plan;
  if (a.config.empty()) throw UsageError("ptrain check needs --config FILE");
  Config c = load_config(a.config, a.sets, env);
  const int ws = static_cast<int>(int_option(a, "--world-size", 1, 1));
  MemoryReport m = predict_memory(c, ws);
  if (a.json) {
    std::cout << m.to_json() << "\n";
    return 0;
  }
  const PrecisionPolicy policy = precision_policy(c);
  const auto& s = c.model.shape;
  std::cout << "# resolved config (" << c.source_file << ")\n" << to_toml(c) << "\n"
            << "# plan\nmodel: " << s.describe() << ", " << log::grouped(static_cast<double>(s.total_params())) << " parameters ("
            << s.n_layers << " blocks of " << log::grouped(static_cast<double>(s.block_params())) << ", embedding "
            << log::grouped(static_cast<double>(s.embedding_params())) << ", head "
            << log::grouped(static_cast<double>(s.head_params())) << ")\n"
            << policy.table();
  if (env.local) {  // the dataset as training will read it (JSONL: tokenized now)
    std::cout << "# data\n";
    for (const auto& line : open_data(c).report) std::cout << line << "\n";
  }
  const PeakPlan plan = predict_peak(c, ws);
  const auto gib = [](int64_t bytes) { return log::fixed(static_cast<double>(bytes) / (1024.0 * 1024 * 1024), 2) + " GiB"; };
  const auto& act = plan.activations;
  std::cout << "predicted peak allocated memory per rank at world size " << ws << " (micro-batch "
            << c.data.micro_batch_size << " x " << c.data.seq_len << " tokens, activation checkpointing "
            << name_of(c.memory.activation_checkpointing) << (c.memory.activation_offloading ? " + offloading" : "") << ", prefetch " << (c.parallel.prefetch ? "on" : "off") << "):\n"
            << "  params            " << gib(m.param_bytes) << "\n"
            << "  grads             " << gib(m.grad_bytes) << "\n"
            << "  optimizer state   " << gib(m.optimizer_state_bytes) << "\n"
            << "  master weights    " << gib(m.master_weight_bytes) << "\n"
            << (c.lora.enabled ? "  frozen base       " + gib(m.frozen_base_bytes) + " (LoRA: not trained" +
                                     (m.nf4_params ? "; NF4 " + log::fixed(m.nf4_bytes_per_param(), 4) +
                                                         " B per 4-bit weight, 1/" + std::to_string(ws) + " on each rank" : std::string()) + ")\n"
                               : std::string())
            << "  activations       " << gib(act.saved_bytes()) << " ("
            << (c.memory.activation_offloading ? "block inputs offloaded: " + gib(act.host_bytes) + " in pinned host memory, " +
                                                     gib(act.in_flight_bytes) + " awaiting their copy"
                                               : std::to_string(act.layers) + " blocks x " + gib(act.per_block_bytes))
            << " + head " << gib(act.head_bytes)
            << (act.mask_bytes ? " + packed rows' attention mask " + gib(act.mask_bytes) : std::string()) << ")\n"
            << "  transient         " << gib(std::max(plan.forward_transient_bytes, plan.backward_transient_bytes))
            << " (largest of: end of forward " << gib(plan.forward_transient_bytes) << ", a block's backward "
            << gib(plan.backward_transient_bytes) << ")\n"
            << "  peak              " << gib(plan.peak_bytes()) << "\n";
  if (!a.options.count("--gpu-memory")) return 0;
  double gpu_gib = 0;
  try {
    gpu_gib = std::stod(a.options.at("--gpu-memory"));
  } catch (const std::exception&) {
  }
  if (!(gpu_gib > 0)) throw UsageError("--gpu-memory must be a positive number of GiB (got '" + a.options.at("--gpu-memory") + "')");
  const double peak_gib = static_cast<double>(plan.peak_bytes()) / (1024.0 * 1024 * 1024);
  if (peak_gib <= gpu_gib) {
    std::cout << "fits: " << log::fixed(peak_gib, 2) << " of " << gpu_gib << " GiB per GPU (margin "
              << log::fixed(gpu_gib - peak_gib, 2) << " GiB)\n";
    return 0;
  }
  // What would fit: each change on its own, then all of them together.
  struct Change {
    std::string what;
    std::vector<std::string> sets;
    int world_size;
  };
  std::vector<Change> changes;
  if (c.memory.activation_checkpointing != Checkpointing::full)
    changes.push_back({"--set memory.activation_checkpointing=full", {"memory.activation_checkpointing=\"full\""}, ws});
  if (!c.memory.activation_offloading)
    changes.push_back({std::string(c.memory.activation_checkpointing != Checkpointing::full ? "--set memory.activation_checkpointing=full " : "") +
                           "--set memory.activation_offloading=true",
                       {"memory.activation_checkpointing=\"full\"", "memory.activation_offloading=true"}, ws});
  if (c.optimizer.name != OptimizerName::adamw8bit && !c.optimizer.in_backward)
    changes.push_back({"--set optimizer.name=adamw8bit", {"optimizer.name=\"adamw8bit\""}, ws});
  if (c.precision.mode != PrecisionMode::bf16 && !c.lora.enabled)
    changes.push_back({"--set precision.mode=bf16", {"precision.mode=\"bf16\""}, ws});
  if (c.data.micro_batch_size > 1)
    changes.push_back({"--set data.micro_batch_size=" + std::to_string(c.data.micro_batch_size / 2) + " (and double grad_accum_steps)",
                       {"data.micro_batch_size=" + std::to_string(c.data.micro_batch_size / 2)}, ws});
  changes.push_back({"--world-size " + std::to_string(2 * ws), {}, 2 * ws});
  std::cerr << "error: predicted peak " << log::fixed(peak_gib, 2) << " GiB per rank does not fit in --gpu-memory " << gpu_gib
            << " GiB. Predicted peak with:\n";
  Change all{"all of the valid ones together", {}, 2 * ws};
  auto report = [&](const Change& ch) {
    std::vector<std::string> with = a.sets;
    with.insert(with.end(), ch.sets.begin(), ch.sets.end());
    try {
      const double p = static_cast<double>(predict_peak(load_config(a.config, with, env), ch.world_size).peak_bytes()) / (1024.0 * 1024 * 1024);
      std::cerr << "  " << ch.what << ": " << log::fixed(p, 2) << " GiB" << (p <= gpu_gib ? " — fits" : "") << "\n";
      return true;
    } catch (const ConfigError&) {
      std::cerr << "  " << ch.what << ": not valid with this config\n";
      return false;
    }
  };
  for (const auto& ch : changes)
    if (report(ch)) all.sets.insert(all.sets.end(), ch.sets.begin(), ch.sets.end());
  report(all);
  return 2;
}

int cmd_eval(const Args& a) {
  if (a.config.empty()) throw UsageError("ptrain eval needs --config FILE");
  std::vector<std::string> sets = a.sets;
  if (a.options.count("--data")) {
    // An explicit file replaces data.path before the config is checked, and is identified by
    // content: token files carry a magic header, JSONL files end in .jsonl (tokenized with
    // data.tokenizer / model.hf_path), anything else is text.
    const std::string& data = a.options.at("--data");
    if (!fs::is_regular_file(data)) throw UsageError("no such data file '" + data + "'");
    char magic[8] = {};
    std::ifstream(data, std::ios::binary).read(magic, 8);
    const char* format = std::memcmp(magic, kTokenMagic, 8) == 0 ? "tokens" : fs::path(data).extension() == ".jsonl" ? "jsonl" : "text";
    sets.push_back("data.path=" + data);
    sets.push_back(std::string("data.format=") + format);
  }
  const Config c = load_config(a.config, sets);
  const std::string& path = c.data.path;
  const RunData data = open_data(c, /*eval_only=*/true);
  const DistEnv env = DistEnv::detect();
  const c10::Device device = resolve_device(c, env);
  auto model = build_model(c, device, connect(c, env, device));
  const bool print = model->comm().rank() == 0;
  std::string source = c.model.hf_path.empty() ? "init(seed=" + std::to_string(c.run.seed) + ")" : c.model.hf_path;
  if (a.options.count("--checkpoint")) {
    TrainProgress progress;
    load_checkpoint(a.options.at("--checkpoint"), *model, nullptr, progress);
    source = a.options.at("--checkpoint");
  }
  EvalResult r = evaluate(*model, *data.rows, c.data.micro_batch_size, c.memory.loss_chunk_tokens);
  if (r.rows == 0) throw RuntimeError("'" + path + "' is shorter than one window of seq_len+1 tokens");
  if (!print) return 0;
  const bool windows = c.data.format != DataFormat::jsonl;
  if (a.json) {
    nlohmann::ordered_json j = {{"data", path}, {"model", source}, {"seq_len", c.data.seq_len}, {windows ? "windows" : "rows", r.rows},
                                {"tokens", r.tokens}, {"mean_loss", r.mean_loss}, {"perplexity", r.perplexity}};
    std::cout << j.dump() << "\n";
  } else {
    std::cout << "eval " << path << " with " << source << ": mean_loss " << log::fixed(r.mean_loss, 6)
              << " nats/token | perplexity " << log::fixed(r.perplexity, 4) << " | " << r.tokens
              << (windows ? " tokens in " + std::to_string(r.rows) + " windows of " + std::to_string(c.data.seq_len + 1)
                          : " trained tokens in " + std::to_string(r.rows) + " rows of " + std::to_string(c.data.seq_len))
              << "\n";
  }
  return 0;
}

int cmd_export(const Args& a) {
  const std::string ckpt = required(a, "--checkpoint"), out = required(a, "--out");
  if (a.merge) {
    export_merged(ckpt, out);
    log::info("merged the adapters of ", ckpt, " into its base: ", out, " (config.json + model.safetensors, float32)");
    return 0;
  }
  export_hf(ckpt, out);
  log::info("exported ", ckpt, " to ", out);
  return 0;
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
  if (a.options.count("--out")) o.out_dir = a.options.at("--out");
  return compare(o);
}

int cmd_tokenize(const Args& a) {
  const std::string in = required(a, "--in"), out = required(a, "--out");
  if (!fs::is_regular_file(in)) throw UsageError("no such input file '" + in + "'");
  if (!a.options.count("--tokenizer")) {  // byte-level: each byte one token
    const int64_t width = int_option(a, "--token-bytes", 2, 2);
    if (width != 2 && width != 4) throw UsageError("--token-bytes must be 2 or 4");
    auto ids = byte_tokenize(read_text_file(in));
    write_token_file(out, ids, 256, static_cast<uint32_t>(width));
    log::info("wrote ", ids.size(), " byte-level tokens (vocab 256, ", width, " bytes each) to ", out);
    return 0;
  }
  const Tokenizer tok(a.options.at("--tokenizer"));
  const int64_t width = int_option(a, "--token-bytes", tok.vocab_size() > 65536 ? 4 : 2, 2);
  if (width != 2 && width != 4) throw UsageError("--token-bytes must be 2 or 4");
  if (width == 2 && tok.vocab_size() > 65536)
    throw UsageError("the tokenizer has " + std::to_string(tok.vocab_size()) + " tokens; ids need --token-bytes 4");
  const bool jsonl = fs::path(in).extension() == ".jsonl";
  const auto eod = jsonl ? tok.id_of("<|end_of_text|>") : std::nullopt;
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_report = 0;
  auto ids = tokenize_file(tok, in, jsonl, eod ? *eod : -1, [&](int64_t done, int64_t total, int64_t tokens) {
    const double s = seconds();
    if (s - last_report < 1.0 && done < total) return;
    last_report = s;
    log::info("tokenize: ", log::bytes(static_cast<double>(done)), " of ", log::bytes(static_cast<double>(total)), " (",
              log::fixed(100.0 * static_cast<double>(done) / static_cast<double>(std::max<int64_t>(total, 1)), 1), "%), ",
              log::grouped(static_cast<double>(tokens)), " tokens, ", log::grouped(static_cast<double>(tokens) / std::max(s, 1e-9)),
              " tokens/s");
  });
  const double s = seconds();
  write_token_file(out, ids, static_cast<uint32_t>(tok.vocab_size()), static_cast<uint32_t>(width));
  log::info("wrote ", log::grouped(static_cast<double>(ids.size())), " tokens (vocab ", tok.vocab_size(), ", ", width,
            " bytes each", jsonl ? std::string(eod ? ", <|end_of_text|> after each document" : ", no end-of-text token") : "",
            ") to ", out, " in ", log::fixed(s, 2), " s: ", log::grouped(static_cast<double>(ids.size()) / std::max(s, 1e-9)),
            " tokens/s (wall clock, one thread)");
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc >= 2 && (!std::strcmp(argv[1], "--help") || !std::strcmp(argv[1], "-h") || !std::strcmp(argv[1], "help"))) {
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
