// Typed configuration: TOML++ file + `--set section.key=value` overrides -> Config.
// Every key, its type, default and meaning is listed once in config.cpp (kKeys); every
// validation rule once in validate.cpp (kRules). Unknown keys, wrong types and rule
// violations are all collected and thrown together as ConfigError (exit code 2).
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/error.h"
#include "data/options.h"
#include "model/objective.h"
#include "model/options.h"
#include "model/shape.h"
#include "optim/options.h"
#include "parallel/options.h"

namespace ptrain {

struct PrecisionPolicy;

// The options that take one of a few names are enums, parsed once when the config loads;
// enum_names<E>() lists the names as TOML spells them, in enumerator order (an unknown name is a
// config error at its line, listing them). The enums and the sections' structs belong to the
// parts that use them (data/options.h, model/options.h, optim/options.h, parallel/options.h),
// whose field initialisers are the keys' defaults; Config composes them.
enum class DeviceChoice { automatic, cpu, cuda };  // "auto", "cpu", "cuda"

template <class E>
const std::vector<std::string>& enum_names();
template <class E>
const std::string& name_of(E value) {
  return enum_names<E>().at(static_cast<size_t>(value));
}

struct Config {
  struct Run {
    std::string name = "ptrain";  // run name; also the default output directory's last part
    std::string output_dir;       // default: runs/<name>
    int64_t seed = 1234;          // init, data order and every RNG derive from it
  } run;
  struct Model {
    std::string preset = "tiny";                        // tiny | llama3_8b | llama3_70b (ignored with hf_path)
    std::string hf_path;                                // HF Llama directory (config.json + *.safetensors)
    GgufReader gguf_reader = GgufReader::transformers;  // a GGUF hf_path's network: whose reading
    LlamaShape shape;                                   // resolved from preset / hf_path, then per-key overrides
    // Read from hf_path's quantization_config (not a key): its projections are stored as
    // bitsandbytes NF4, with double-quantized statistics when hf_nf4_double_quant.
    bool hf_nf4 = false, hf_nf4_double_quant = false;
    double init_std = 0.02;  // N(0, init_std) init of matrices; output projections / sqrt(2L)
  } model;
  DataOptions data;
  struct Training {
    int64_t steps = 200;                      // optimizer steps
    int64_t grad_accum_steps = 1;             // micro-batches per optimizer step
    double max_grad_norm = 1.0;               // global-norm clipping; 0 disables
    int64_t log_every = 10;                   // console + metrics.jsonl cadence (steps)
    int64_t eval_every = 100;                 // validation cadence (steps); 0 disables
    int64_t eval_batches = 4;                 // micro-batches per validation
    std::vector<std::string> sample_prompts;  // completed greedily at each eval and logged
    int64_t sample_tokens = 32;               // new tokens per sample
    bool sample_chat = false;                 // sample prompts rendered as a user turn of the chat template
    bool count_lost_updates = false;          // log the updates rounding kept from changing a parameter
    bool token_metrics = true;                // SFT: TRL's entropy and mean_token_accuracy on logged steps
    int64_t profile_steps = 0;                // steps traced by LibTorch's profiler (0: none)
    int64_t profile_start = 3;                // the first traced step
    DeviceChoice device = DeviceChoice::automatic;
    int64_t threads = 0;  // CPU intra-op threads; 0 = LibTorch default
    Objective objective = Objective::sft;
  } training;
  PreferenceOptions preference;
  OptimizerOptions optimizer;
  LrScheduleOptions lr_schedule;
  PrecisionOptions precision;
  ParallelOptions parallel;
  MemoryOptions memory;
  struct Checkpoint {
    std::string dir;          // default: <output_dir>/checkpoints
    int64_t every_steps = 0;  // 0 = only the final checkpoint
    int64_t keep = 3;         // newest complete checkpoints kept
    std::string resume;       // "" (fresh start) | "auto" (newest in dir) | a step_N directory
    bool save_final = true;   // write a checkpoint after the last step
  } checkpoint;
  LoraOptions lora;
  QuantOptions quant;
  KernelOptions kernels;

  // Where each explicitly set key came from, for error messages.
  struct Origin {
    std::string file;
    int line = 0;
  };
  std::string source_file;                // the --config path
  std::map<std::string, Origin> origins;  // "section.key" -> origin

  std::string output_dir() const;      // run.output_dir or runs/<name>
  std::string checkpoint_dir() const;  // checkpoint.dir or <output_dir>/checkpoints
  std::string tokenizer_path() const;  // data.tokenizer or model.hf_path
  bool is_set(const std::string& key) const { return origins.count(key) > 0; }
  Origin origin(const std::string& key) const;
};

// Facts about the machine that validation needs (injected so tests can vary them).
struct Environment {
  bool cuda_available = false;
  // false: the config is for another machine (`ptrain check --plan`): this machine's data
  // files, checkpoints and GPUs are not checked.
  bool local = true;
  static Environment detect();
};

// Parses, applies overrides, resolves the model shape and validates. Throws ConfigError
// listing every problem.
Config load_config(const std::string& path, const std::vector<std::string>& overrides,
                   const Environment& env = Environment::detect());

// DPO's preference.ref_model as a config of its own: this one with the reference as model.hf_path,
// its shape and NF4 storage read from it, no adapter loaded (LoRA's stay off: the reference is a
// base), built as the policy's base is. Throws where the path is not a model ptrain reads.
Config reference_config(const Config& config);

// Collects rule violations (validate.cpp).
void validate(const Config& config, const Environment& env, std::vector<ConfigProblem>& out);

// The fully resolved config as TOML (written to config.resolved.toml, printed by check).
std::string to_toml(const Config& config);

// docs/config.md: every key with its default and meaning, rendered from the key table.
std::string config_reference();

// Which dtype each class of tensor lives in, from [precision] (and optimizer.name for 8-bit state).
PrecisionPolicy precision_policy(const Config& config);

// Every known key as "section.key" (for tests and suggestions).
std::vector<std::string> known_keys();

}  // namespace ptrain
