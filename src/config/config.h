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
#include "data/chat.h"
#include "model/shape.h"
#include "optim/lr_schedule.h"

namespace ptrain {

struct PrecisionPolicy;

// The options that take one of a few names, parsed once when the config loads; enum_names<E>()
// lists the names as TOML spells them, in enumerator order (an unknown name is a config error
// at its line, listing them).
enum class DataFormat { text, tokens, jsonl, parquet };
// jsonl and parquet: records (text, chats, prompt/completion) rendered into samples with a loss mask.
inline bool holds_records(DataFormat f) { return f == DataFormat::jsonl || f == DataFormat::parquet; }
enum class Truncation { truncate, drop };
enum class BadRecord { error, skip };
enum class DeviceChoice { automatic, cpu, cuda };  // "auto", "cpu", "cuda"
enum class OptimizerName { adamw, adamw8bit };
enum class PrecisionMode { fp32, mixed, bf16 };
enum class DtypeName { from_mode, float32, bfloat16 };  // "" (the mode decides), "float32", "bfloat16"
enum class Backend { automatic, nccl, mpi, gloo };      // "auto", ...
enum class Checkpointing { none, full };
enum class QuantBase { none, nf4 };

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
    std::string preset = "tiny";  // tiny | llama3_8b | llama3_70b (ignored with hf_path)
    std::string hf_path;          // HF Llama directory (config.json + *.safetensors)
    LlamaShape shape;             // resolved from preset / hf_path, then per-key overrides
    // Read from hf_path's quantization_config (not a key): its projections are stored as
    // bitsandbytes NF4, with double-quantized statistics when hf_nf4_double_quant.
    bool hf_nf4 = false, hf_nf4_double_quant = false;
    double init_std = 0.02;  // N(0, init_std) init of matrices; output projections / sqrt(2L)
  } model;
  struct Data {
    std::string path;  // text file (byte-level tokens), .bin token file or .jsonl records
    DataFormat format = DataFormat::text;
    std::string tokenizer;                       // jsonl: tokenizer.json or its directory (default: model.hf_path)
    std::vector<std::string> fields;             // jsonl/parquet: "canonical=theirs" field names ("output=answer")
    BadRecord on_bad_record = BadRecord::error;  // jsonl/parquet: stop at a malformed record, or skip and count it
    ChatTemplate chat_template =
        ChatTemplate::automatic;                   // jsonl chats: the template (auto: the tokenizer directory's)
    bool packing = false;                          // jsonl: several samples per row
    bool train_on_prompt = false;                  // jsonl: train on prompts too, not only on replies / completions
    Truncation truncation = Truncation::truncate;  // jsonl: samples longer than a row
    bool cache = true;                             // jsonl/parquet: tokenize once into a mapped cache file
    std::string cache_dir;                         // where (default: $PTRAIN_DATA_CACHE or ~/.cache/ptrain/datasets)
    int64_t seq_len = 128;                         // tokens per training sequence
    int64_t micro_batch_size = 8;                  // sequences per forward/backward per rank
    double val_fraction = 0.05;  // held out for validation: the tail of a token stream; jsonl: samples
  } data;
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
    DeviceChoice device = DeviceChoice::automatic;
    int64_t threads = 0;  // CPU intra-op threads; 0 = LibTorch default
  } training;
  struct Optimizer {
    OptimizerName name = OptimizerName::adamw;
    double lr = 3e-4;                      // peak learning rate
    std::vector<double> betas{0.9, 0.95};  // Adam beta1, beta2
    double eps = 1e-8;
    double weight_decay = 0.1;  // decoupled; matrices only (not norm weights)
    bool in_backward = false;   // step each unit during backward
  } optimizer;
  struct LrSchedule {
    int64_t warmup_steps = 20;    // linear warmup from lr/warmup to lr
    Decay decay = Decay::cosine;  // after warmup
    double min_lr_ratio = 0.1;    // final lr = lr * min_lr_ratio (cosine, linear)
  } lr_schedule;
  struct Precision {
    PrecisionMode mode = PrecisionMode::fp32;
    DtypeName param_dtype = DtypeName::from_mode;   // compute/all-gather dtype
    DtypeName reduce_dtype = DtypeName::from_mode;  // gradient reduction dtype
    DtypeName logits_dtype = DtypeName::float32;    // bfloat16 only with allow_bf16_logits
    bool allow_bf16_logits = false;                 // explicit opt-in for bfloat16 logits
    DtypeName rope_dtype = DtypeName::float32;      // must be float32 (stated, checked)
    bool stochastic_rounding = false;
    bool kahan_summation = false;  // bf16: a compensation buffer per parameter
  } precision;
  struct Parallel {
    Backend backend = Backend::automatic;
    bool reshard_after_forward = true;  // ZeRO-3 (true) or keep gathered for backward
    bool prefetch = true;               // gather the next unit ahead of time (overlaps compute)
    double timeout_s = 600.0;           // collective timeout before a rank is declared dead
  } parallel;
  struct Memory {
    Checkpointing activation_checkpointing = Checkpointing::none;  // full: recompute each block in backward
    bool activation_offloading = false;  // full checkpointing's kept block inputs live in host memory
    int64_t loss_chunk_tokens = 0;       // tokens per cross-entropy chunk; 0 = auto
  } memory;
  struct Checkpoint {
    std::string dir;          // default: <output_dir>/checkpoints
    int64_t every_steps = 0;  // 0 = only the final checkpoint
    int64_t keep = 3;         // newest complete checkpoints kept
    std::string resume;       // "" (fresh start) | "auto" (newest in dir) | a step_N directory
    bool save_final = true;   // write a checkpoint after the last step
  } checkpoint;
  struct Lora {
    bool enabled = false;
    int64_t rank = 8;
    double alpha = 16.0;
    double dropout = 0.0;
    bool rslora = false;  // scale alpha / sqrt(rank) instead of alpha / rank (PEFT use_rslora)
    std::vector<std::string> targets{"q", "v"};
    std::string adapter_path;  // "" | a PEFT adapter directory to start from
  } lora;
  struct Quant {
    QuantBase base = QuantBase::none;
    bool double_quant = true;
  } quant;

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
