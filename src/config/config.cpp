// TOML -> Config: the key table (kKeys), parsing with source lines, overrides, and
// resolution of the model shape from preset / hf_path.
#include "config/config.h"

#include <toml++/toml.h>

#include <algorithm>
#include <array>
#include <charconv>
#include <filesystem>
#include <functional>
#include <set>
#include <sstream>
#include <stdexcept>
#include <type_traits>
#include <variant>

#include "checkpoint/gguf_model.h"
#include "checkpoint/hf.h"
#include "common/suggest.h"
#include "parallel/precision.h"

namespace ptrain {

namespace fs = std::filesystem;

template <>
const std::vector<std::string>& enum_names<DataFormat>() {
  return data_format_names();
}
template <>
const std::vector<std::string>& enum_names<Truncation>() {
  static const std::vector<std::string> n{"truncate", "drop"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<DeviceChoice>() {
  static const std::vector<std::string> n{"auto", "cpu", "cuda"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<OptimizerName>() {
  static const std::vector<std::string> n{"adamw", "adamw8bit"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<Decay>() {
  static const std::vector<std::string> n{"cosine", "linear", "constant"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<PrecisionMode>() {
  static const std::vector<std::string> n{"fp32", "mixed", "bf16"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<DtypeName>() {
  static const std::vector<std::string> n{"", "float32", "bfloat16"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<Backend>() {
  static const std::vector<std::string> n{"auto", "nccl", "mpi", "gloo"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<Checkpointing>() {
  static const std::vector<std::string> n{"none", "full"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<QuantBase>() {
  static const std::vector<std::string> n{"none", "nf4"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<GgufReader>() {
  static const std::vector<std::string> n{"transformers", "llama.cpp"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<Objective>() {
  static const std::vector<std::string> n{"sft", "dpo", "simpo", "cpo", "orpo", "kto"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<PreferenceLoss>() {
  static const std::vector<std::string> n{
      "sigmoid",  "hinge",     "ipo",          "exo_pair",     "nca_pair",         "robust",
      "bco_pair", "sppo_hard", "aot",          "aot_unpaired", "apo_zero",         "apo_down",
      "discopop", "sft",       "sigmoid_norm", "kto",          "apo_zero_unpaired"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<FDivergence>() {
  static const std::vector<std::string> n{"reverse_kl", "forward_kl", "js_divergence", "alpha_divergence"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<BadRecord>() {
  static const std::vector<std::string> n{"error", "skip"};
  return n;
}
template <>
const std::vector<std::string>& enum_names<ChatTemplate>() {
  return chat_template_names();
}
template <>
const std::vector<std::string>& enum_names<RopeType>() {
  return rope_type_names();
}
template <>
const std::vector<std::string>& enum_names<Family>() {
  static const std::vector<std::string> n = [] {
    std::vector<std::string> names;
    for (const auto& f : families()) names.push_back(f.name);  // the table lists them in enumerator order
    return names;
  }();
  return n;
}

std::string Config::output_dir() const { return run.output_dir.empty() ? "runs/" + run.name : run.output_dir; }

std::string Config::tokenizer_path() const { return data.tokenizer.empty() ? model.hf_path : data.tokenizer; }

std::string Config::checkpoint_dir() const {
  return checkpoint.dir.empty() ? output_dir() + "/checkpoints" : checkpoint.dir;
}

Config::Origin Config::origin(const std::string& key) const {
  auto it = origins.find(key);
  if (it != origins.end()) return it->second;
  return Origin{source_file, 0};
}

namespace {

using Value = std::variant<int64_t, double, bool, std::string, std::vector<double>, std::vector<std::string>>;
enum class Type { Int, Float, Bool, String, FloatList, StringList, Names };

const char* type_name(Type t) {
  switch (t) {
    case Type::Int:
      return "an integer";
    case Type::Float:
      return "a number";
    case Type::Bool:
      return "true or false";
    case Type::String:
      return "a string";
    case Type::FloatList:
      return "an array of numbers";
    case Type::StringList:
      return "an array of strings";
    case Type::Names:
      return "a name or an array of names";
  }
  return "?";
}

template <class T>
constexpr Type type_of() {
  return Type::String;
}  // the enums: a name
template <>
constexpr Type type_of<int64_t>() {
  return Type::Int;
}
template <>
constexpr Type type_of<double>() {
  return Type::Float;
}
template <>
constexpr Type type_of<bool>() {
  return Type::Bool;
}
template <>
constexpr Type type_of<std::string>() {
  return Type::String;
}
template <>
constexpr Type type_of<std::vector<double>>() {
  return Type::FloatList;
}
template <>
constexpr Type type_of<std::vector<std::string>>() {
  return Type::StringList;
}
template <>
constexpr Type type_of<std::vector<PreferenceLoss>>() {
  return Type::Names;
}  // enums: one name, or several (as TRL's list fields take a string or a list)

// A name that is not one of an enum's: reported at the key's line with the names allowed.
struct UnknownName : std::runtime_error {
  using std::runtime_error::runtime_error;
};

template <class T>
T enum_of(const std::string& name) {
  const auto& names = enum_names<T>();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<T>(i);
  std::string allowed;
  for (const auto& n : names) allowed += (allowed.empty() ? "\"" : ", \"") + n + "\"";
  throw UnknownName("unknown value \"" + name + "\"; use one of " + allowed);
}

template <class T>
struct is_enum_list : std::false_type {};
template <class E>
struct is_enum_list<std::vector<E>> : std::is_enum<E> {};

template <class T>
T from_value(const Value& v) {
  if constexpr (std::is_enum_v<T>) {
    return enum_of<T>(std::get<std::string>(v));
  } else if constexpr (is_enum_list<T>::value) {
    T out;
    for (const std::string& name : std::get<std::vector<std::string>>(v))
      out.push_back(enum_of<typename T::value_type>(name));
    return out;
  } else {
    return std::get<T>(v);
  }
}

template <class T>
Value to_value(const T& x) {
  if constexpr (std::is_enum_v<T>) {
    return Value(name_of(x));
  } else if constexpr (is_enum_list<T>::value) {
    std::vector<std::string> names;
    for (const auto& e : x) names.push_back(name_of(e));
    return Value(names);
  } else {
    return Value(x);
  }
}

struct Key {
  std::string section;
  std::string name;
  Type type;
  std::function<void(Config&, const Value&)> set;
  std::function<Value(const Config&)> get;
  bool model_dim = false;   // part of the model shape (taken from hf_path's config.json there)
  std::string default_doc;  // kFromStruct: Config{}'s value; else how docs/config.md describes it
  std::string doc;          // what the key means (docs/config.md is generated from these)
  std::string full() const { return section + "." + name; }
};

// One entry per config key, with its documentation (config_reference() renders docs/config.md
// from this table). Defaults live in the option structs' initialisers (Config composes them:
// data/options.h, model/options.h, optim/options.h, parallel/options.h, config.h) and nowhere
// else: a key's default column is rendered from Config{} (kFromStruct), unless the default is
// not one value (a preset's, a path derived from another key), which the table then describes.
constexpr const char* kFromStruct = "";
#define PTRAIN_KEY(SEC, NAME, MEMBER, DEFAULT, DOC)                                                    \
  Key {                                                                                                \
    SEC, NAME, type_of<std::decay_t<decltype(Config{}.MEMBER)>>(),                                     \
        [](Config& c, const Value& v) { c.MEMBER = from_value<std::decay_t<decltype(c.MEMBER)>>(v); }, \
        [](const Config& c) { return to_value(c.MEMBER); }, false, DEFAULT, DOC                        \
  }
#define PTRAIN_DIM(NAME, MEMBER, DEFAULT, DOC)               \
  [] {                                                       \
    Key k = PTRAIN_KEY("model", NAME, MEMBER, DEFAULT, DOC); \
    k.model_dim = true;                                      \
    return k;                                                \
  }()

const std::vector<Key>& keys() {
  // One key a line, as written (clang-format 14 re-lays the whole table out as it grows).
  // clang-format off
  static const std::vector<Key> kKeys = {
      PTRAIN_KEY("run", "name", run.name, kFromStruct, R"(run name; the output directory defaults to `runs/<name>`)"),
      PTRAIN_KEY("run", "output_dir", run.output_dir, R"(`runs/<name>`)",
                 R"(where `config.resolved.toml`, `metrics.jsonl`, `memory.json`, `checkpoints/` go)"),
      PTRAIN_KEY("run", "seed", run.seed, kFromStruct, R"(seeds weight init (per unit) and the data order)"),
      PTRAIN_KEY(
          "model", "preset", model.preset, kFromStruct,
          R"(`tiny` (~12M, CPU demo), `llama3_2_1b` (1.24B, tied), `llama3_8b`, `llama3_70b`, `qwen2_5_0_5b`, `qwen2_5_1_5b`, `qwen2_5_7b`, `qwen3_0_6b`, `qwen3_8b`, `mistral_7b` (v0.3) — the published shapes, initialised from `run.seed` (set `hf_path` to fine-tune released weights))"),
      PTRAIN_KEY(
          "model", "hf_path", model.hf_path, kFromStruct,
          R"(Hugging Face model directory of a supported family — `llama`, `mistral`, `qwen2`, `qwen3` (`docs/models.md`) — with `config.json` + `model.safetensors` or shards listed in `model.safetensors.index.json` (or the file `config.json`'s `transformers_weights` names; or `pytorch_model.bin` or its shards, as transformers loads them); the shape comes from its `config.json` (setting shape keys too is an error); a key or tensor ptrain does not implement is refused by name; a bitsandbytes NF4 checkpoint (`*-bnb-4bit`) loads as the QLoRA base as stored (`docs/qlora.md`); or a GGUF file (or a directory holding one and no `config.json`), read as transformers' GGUF loader reads it: its weights dequantized (every type gguf-py dequantizes: F32, F16, BF16, Q4_0 ... Q8_0, Q2_K ... Q6_K, the i-quants IQ1_S ... IQ4_XS, TQ1_0, TQ2_0, MXFP4, NVFP4), its config from the metadata with its tokenizer and chat template (`docs/export.md`, "GGUF as the base"))"),
      PTRAIN_KEY(
          "model", "gguf_reader", model.gguf_reader, kFromStruct,
          R"(which network a GGUF `hf_path` holds: `transformers` (what its GGUF loader builds; a file with what that loader drops but llama.cpp computes with — RoPE scaling, Llama attention biases — is refused) or `llama.cpp` (those too, as llama.cpp computes with them: every Llama 3.x GGUF's `rope_freqs` as Llama 3.1's scaling; a split model's parts, from its first; `docs/export.md`, "GGUF as the base"))"),
      PTRAIN_KEY(
          "model", "init_std", model.init_std, kFromStruct,
          R"(std of the normal init of matrices; `o_proj`/`down_proj` use `init_std / sqrt(2 * n_layers)`; norms start at 1)"),
      PTRAIN_DIM(
          "family", model.shape.family, R"(preset (`"llama"`))",
          R"(`llama`, `mistral`, `qwen2` (q/k/v biases), `qwen3` (per-head q/k RMSNorm): the decoder's variations, `docs/models.md`)"),
      PTRAIN_DIM("attention_bias", model.shape.attention_bias, kFromStruct,
                 R"(`llama`, `qwen3`: biases on the q/k/v/o projections)"),
      PTRAIN_DIM("mlp_bias", model.shape.mlp_bias, kFromStruct, R"(`llama`: biases on the gate/up/down projections)"),
      PTRAIN_DIM("dim", model.shape.dim, R"(preset)", R"(hidden size)"),
      PTRAIN_DIM("n_layers", model.shape.n_layers, R"(preset)", R"(transformer blocks)"),
      PTRAIN_DIM("n_heads", model.shape.n_heads, R"(preset)",
                 R"(query heads; `dim % n_heads == 0` unless `head_dim` is set)"),
      PTRAIN_DIM("n_kv_heads", model.shape.n_kv_heads, R"(preset)", R"(key/value heads (GQA); must divide `n_heads`)"),
      PTRAIN_DIM("head_dim", model.shape.head_dim, R"(`dim / n_heads`)", R"(per-head size (even: RoPE rotates pairs))"),
      PTRAIN_DIM("ffn_dim", model.shape.ffn_dim, R"(preset)", R"(SwiGLU hidden size)"),
      PTRAIN_DIM("vocab_size", model.shape.vocab_size, R"(preset)", R"(vocabulary; text data needs >= 256 (bytes))"),
      PTRAIN_DIM("max_seq_len", model.shape.max_seq_len, R"(preset)",
                 R"(longest sequence; `data.seq_len` must not exceed it)"),
      PTRAIN_DIM("rope_theta", model.shape.rope_theta, R"(preset)", R"(RoPE base)"),
      PTRAIN_DIM("norm_eps", model.shape.norm_eps, R"(preset)", R"(RMSNorm epsilon)"),
      PTRAIN_DIM("tie_embeddings", model.shape.tie_embeddings, kFromStruct,
                 R"(output projection shares the embedding matrix)"),
      PTRAIN_DIM("rope_scaling_factor", model.shape.rope_scaling.factor, R"(preset (8 for Llama 3))",
                 R"(RoPE frequency scaling factor (>= 1; 0 disables), of the type `rope_scaling_type` (`docs/models.md`))"),
      PTRAIN_DIM("rope_scaling_type", model.shape.rope_scaling.type, kFromStruct,
                 R"(which scaling `rope_scaling_factor` applies: `llama3` (Llama 3.1's bands), `linear` (every frequency divided by the factor) or `yarn` (YaRN over `rope_original_max_seq_len`, which must then be set: beta_fast 32, beta_slow 1, ends truncated, cos/sin scaled by 0.1 ln(factor) + 1; `hf_path`'s `config.json` may set the rest))"),
      PTRAIN_DIM("rope_low_freq_factor", model.shape.rope_scaling.low_freq_factor, kFromStruct,
                 R"(Llama-3.1 scaling parameter)"),
      PTRAIN_DIM("rope_high_freq_factor", model.shape.rope_scaling.high_freq_factor, kFromStruct,
                 R"(Llama-3.1 scaling parameter)"),
      PTRAIN_DIM("rope_original_max_seq_len", model.shape.rope_scaling.original_max_seq_len, kFromStruct,
                 R"(Llama-3.1 and YaRN scaling parameter: the context the model was pretrained for)"),
      PTRAIN_KEY("data", "path", data.path, R"(— (required))",
                 R"(text file, token file or JSONL file (`docs/data.md`))"),
      PTRAIN_KEY(
          "data", "format", data.format, kFromStruct,
          R"(`text` (byte-level tokens, vocab 256), `tokens` (`.bin` made by `ptrain tokenize`) `jsonl` (text, chat — messages, ShareGPT, Alpaca — or prompt/completion records, one per line, tokenized as they load), `json` (the same records as the elements of one JSON array, as `alpaca_data.json` and ShareGPT dumps hold them) or `parquet` (the same records, one per row, a column per field))"),
      PTRAIN_KEY("data", "tokenizer", data.tokenizer, R"(`model.hf_path`)",
                 R"(jsonl: `tokenizer.json`, the HF model directory holding it, or a GGUF file (its `tokenizer.ggml.*` as transformers builds the tokenizer: `docs/export.md`))"),
      PTRAIN_KEY(
          "data", "fields", data.fields, kFromStruct,
          R"(jsonl/json/parquet: the dataset's own names for record fields, as `"canonical=theirs"` (e.g. `["instruction=question", "output=answer", "messages=dialog"]`); canonical fields: text, messages, role, content, conversations, from, value, instruction, input, output, system, history, prompt, completion)"),
      PTRAIN_KEY(
          "data", "ignore_fields", data.ignore_fields, kFromStruct,
          R"(jsonl/json/parquet: fields of a record or of its turns (Parquet: columns) to leave out knowingly, as the data names them (e.g. `["id", "source"]`); any other field a record kind does not read is refused by name)"),
      PTRAIN_KEY(
          "data", "on_bad_record", data.on_bad_record, kFromStruct,
          R"(jsonl/json/parquet: a malformed record stops with its `FILE:LINE` and field (`error`), or is left out, counted and reported with the first one's location (`skip`))"),
      PTRAIN_KEY(
          "data", "chat_template", data.chat_template, kFromStruct,
          R"(jsonl chats (messages, ShareGPT, Alpaca): `auto` recognizes the template in the tokenizer's directory (`tokenizer_config.json` / `chat_template.jinja`; a GGUF file's `tokenizer.chat_template`) and refuses one it does not know; or `llama3`, `llama3.1`, `llama3.2`, `qwen2.5`, `qwen3`, `chatml`, `mistral`, `mistral-system-first`, `mistral-v0.2`, `mistral-v0.1`, `mistral-nemo`, `mistral-tekken`, `devstral`, `deepseek-r1`, `qwq` (docs/data.md; `qwen2.5`, `llama3.1`, `llama3.2` and `mistral-nemo` render chats with tools as their released templates do))"),
      PTRAIN_KEY(
          "data", "packing", data.packing, kFromStruct,
          R"(jsonl: pack several samples into each row (attention and positions stay inside each sample); `false` pads one sample per row)"),
      PTRAIN_KEY("data", "train_on_prompt", data.train_on_prompt, kFromStruct,
                 R"(jsonl: also train on system/user turns and prompts (by default only replies and completions are))"),
      PTRAIN_KEY(
          "data", "truncation", data.truncation, kFromStruct,
          R"(jsonl: a sample longer than `seq_len + 1` tokens is cut to its start (`truncate`) or left out (`drop`); both are counted and reported)"),
      PTRAIN_KEY(
          "data", "cache", data.cache, kFromStruct,
          R"(jsonl/json/parquet: tokenize the file once into a cache file that later runs and every rank map read-only instead of tokenizing again; a changed data file, tokenizer, template or data option makes a new one (docs/data.md); `false` tokenizes into memory at every start)"),
      PTRAIN_KEY("data", "cache_dir", data.cache_dir, R"(`$PTRAIN_DATA_CACHE`, else `~/.cache/ptrain/datasets`)",
                 R"(jsonl/json/parquet: the directory of the cache files (made if missing))"),
      PTRAIN_KEY("data", "seq_len", data.seq_len, kFromStruct,
                 R"(tokens per sequence; windows hold `seq_len + 1` tokens)"),
      PTRAIN_KEY("data", "micro_batch_size", data.micro_batch_size, kFromStruct, R"(sequences per forward/backward)"),
      PTRAIN_KEY(
          "data", "val_fraction", data.val_fraction, kFromStruct,
          R"(held out for validation (0 to 0.5): the tail of a token stream; jsonl: that share of the samples, drawn with a fixed seed)"),
      PTRAIN_KEY("training", "steps", training.steps, kFromStruct, R"(optimizer steps (>= 1))"),
      PTRAIN_KEY(
          "training", "objective", training.objective, kFromStruct,
          R"(`sft`: next-token cross-entropy on the trained tokens; `dpo`: DPO on preference pairs against the base with the LoRA adapters off (TRL's `DPOTrainer`); `simpo`: SimPO, reference-free (TRL's `CPOTrainer` with `loss_type = "simpo"`, `cpo_alpha = 0`); `cpo`: CPO, reference-free (TRL's `CPOTrainer`: `loss_type` `sigmoid`, `hinge` or `ipo`, plus `cpo_alpha` times the chosen completions' NLL); `orpo`: ORPO, reference-free (TRL's `ORPOTrainer`: the chosen sequences' NLL, prompt included, minus `beta` times log sigma of the log odds ratio); `kto`: KTO against the same reference as `dpo`, on completions each desirable or not (TRL's `KTOTrainer`). Preference objectives read `{prompt, chosen, rejected}` records, `kto` also unpaired `{prompt, completion, label}` ones (docs/preference.md))"),
      PTRAIN_KEY("training", "grad_accum_steps", training.grad_accum_steps, kFromStruct,
                 R"(micro-batches accumulated per optimizer step)"),
      PTRAIN_KEY("training", "max_grad_norm", training.max_grad_norm, kFromStruct,
                 R"(global-norm clipping threshold; 0 disables)"),
      PTRAIN_KEY("training", "log_every", training.log_every, kFromStruct,
                 R"(console line + `metrics.jsonl` record every N steps (and at steps 1 and last))"),
      PTRAIN_KEY("training", "eval_every", training.eval_every, kFromStruct,
                 R"(validation loss every N steps and at the end; 0 disables)"),
      PTRAIN_KEY("training", "eval_batches", training.eval_batches, kFromStruct,
                 R"(micro-batches of consecutive validation windows per evaluation)"),
      PTRAIN_KEY(
          "training", "sample_prompts",
          training.sample_prompts, kFromStruct, R"(prompts the model completes greedily at each evaluation (every rank takes part; rank 0 logs them and writes them to metrics.jsonl), with the tokenizer of `data.tokenizer` / `model.hf_path` (docs/generate.md))"),
      PTRAIN_KEY("training", "sample_tokens", training.sample_tokens, kFromStruct,
                 R"(new tokens per sample prompt (fewer when an end-of-sequence token comes))"),
      PTRAIN_KEY(
          "training", "sample_chat", training.sample_chat, kFromStruct,
          R"(render each sample prompt as a user turn of the chat template (`data.chat_template`) rather than as plain text)"),
      PTRAIN_KEY(
          "training", "token_metrics", training.token_metrics, kFromStruct,
          R"(supervised fine-tuning (`training.objective = "sft"`): write TRL's `entropy` and `mean_token_accuracy` to metrics.jsonl on the steps it logs (token means over the trained tokens, docs/commands.md) and `val_entropy` / `val_mean_token_accuracy` with each evaluation (`ptrain eval` too), which costs one more pass over each loss chunk's logits there; `false` leaves them out (the speed benchmarks do: their references compute neither). Preference objectives compute theirs with the loss)"),
      PTRAIN_KEY(
          "training", "count_lost_updates", training.count_lost_updates, kFromStruct,
          R"(count, at every step, the parameter elements whose computed update was non-zero but whose stored value (with its Kahan compensation) did not change — updates lost to rounding; logged as `updates_computed` / `updates_lost` in metrics.jsonl (summed over ranks since the last logged step); costs a copy of the parameter shards per step. `ptrain compare` turns it on)"),
      PTRAIN_KEY(
          "training", "profile_steps", training.profile_steps, kFromStruct,
          R"(trace this many consecutive steps with LibTorch's profiler (Kineto: CPU operators with their shapes and, on CUDA, every kernel and copy) and write the trace to `trace.rank<R>.json` in the run directory, one per rank (Chrome trace format: chrome://tracing, Perfetto, or `bench/trace_summary.py`); 0 traces nothing. Tracing slows the traced steps)"),
      PTRAIN_KEY("training", "profile_start", training.profile_start, kFromStruct,
                 R"(the first traced step (>= 1; step 1 includes one-time start-up work))"),
      PTRAIN_KEY("training", "device", training.device, kFromStruct,
                 R"(`auto` (CUDA if visible), `cpu`, `cuda` (an error without a GPU))"),
      PTRAIN_KEY("training", "threads", training.threads, kFromStruct,
                 R"(CPU intra-op threads; 0 keeps LibTorch's default)"),
      PTRAIN_KEY(
          "optimizer", "name", optimizer.name, kFromStruct,
          R"(`adamw` (float32 or bf16 moments per precision mode) or `adamw8bit` (bitsandbytes' blockwise 8-bit moments: uint8 codes + a float32 absmax per 256 elements, float32 moments for tensors under 4096 elements; ~2.03 B/param instead of 8))"),
      PTRAIN_KEY("optimizer", "lr", optimizer.lr, kFromStruct, R"(peak learning rate (> 0))"),
      PTRAIN_KEY("optimizer", "betas", optimizer.betas, kFromStruct, R"(Adam betas, each in [0, 1))"),
      PTRAIN_KEY("optimizer", "eps", optimizer.eps, kFromStruct, R"(Adam epsilon (> 0))"),
      PTRAIN_KEY("optimizer", "weight_decay", optimizer.weight_decay, kFromStruct,
                 R"(decoupled weight decay on matrices (embedding, projections); norm weights are not decayed)"),
      PTRAIN_KEY(
          "optimizer", "in_backward", optimizer.in_backward, kFromStruct,
          R"(step each unit's shard right after its gradient is reduced and drop the gradient, so no full set of gradients ever exists (`grad_bytes` 0 in memory.json); needs `training.grad_accum_steps = 1` and `training.max_grad_norm = 0`; `grad_norm` is then logged unclipped)"),
      PTRAIN_KEY("lr_schedule", "warmup_steps", lr_schedule.warmup_steps, kFromStruct,
                 R"(linear warmup: step s (0-based) uses `lr * (s+1) / warmup_steps`)"),
      PTRAIN_KEY("lr_schedule", "decay", lr_schedule.decay, kFromStruct,
                 R"(after warmup: `cosine` or `linear` down to `lr * min_lr_ratio` at the last step, or `constant`)"),
      PTRAIN_KEY("lr_schedule", "min_lr_ratio", lr_schedule.min_lr_ratio, kFromStruct,
                 R"(final learning rate as a fraction of `lr`)"),
      PTRAIN_KEY(
          "precision", "mode", precision.mode, kFromStruct,
          R"(`fp32`; `mixed` (bf16 compute over fp32 master weights, 16 B/param); `bf16` (bf16 params, grads and AdamW moments, fp32 update math, fp32 logits/loss and RoPE, 8 B/param))"),
      PTRAIN_KEY(
          "precision", "param_dtype", precision.param_dtype, R"(from mode)",
          R"(compute / all-gather dtype; `float32` with `fp32`, `bfloat16` with `mixed` and `bf16` (other combinations are errors))"),
      PTRAIN_KEY(
          "precision", "reduce_dtype", precision.reduce_dtype, R"(from mode)",
          R"(gradient reduction dtype: `float32` in `fp32`/`mixed`, `bfloat16` in `bf16`; MPI (CPU) sums bfloat16 gradients as float32)"),
      PTRAIN_KEY(
          "precision", "logits_dtype", precision.logits_dtype, kFromStruct,
          R"(dtype the logits are held in (the output GEMM always accumulates in float32, the loss is summed in float32). `bfloat16` is allowed in `mixed`/`bf16` only with `allow_bf16_logits = true`: it saves at most one loss chunk and rounds every logit, so ptrain warns)"),
      PTRAIN_KEY("precision", "allow_bf16_logits", precision.allow_bf16_logits, kFromStruct,
                 R"(explicit opt-in for `logits_dtype = "bfloat16"`; an error with any other `logits_dtype`)"),
      PTRAIN_KEY("precision", "rope_dtype", precision.rope_dtype, kFromStruct, R"(RoPE is always computed in float32)"),
      PTRAIN_KEY(
          "precision", "stochastic_rounding", precision.stochastic_rounding, kFromStruct,
          R"(`bf16` only: round updated parameters stochastically (unbiased, reproducible from `run.seed`) instead of to nearest)"),
      PTRAIN_KEY(
          "precision", "kahan_summation", precision.kahan_summation, kFromStruct,
          R"(`bf16` with `optimizer.name = "adamw"` only, not with `stochastic_rounding`: keep a bfloat16 compensation buffer per parameter (+2 bytes/param, sharded and checkpointed like the moments) holding what rounding each new parameter to nearest dropped, added to the next update (Kahan summation), so updates below half a bf16 ulp accumulate instead of vanishing)"),
      PTRAIN_KEY("parallel", "backend", parallel.backend, kFromStruct,
                 R"(`auto`, `nccl` (CUDA only), `mpi`; `gloo` is refused (the torch wheel ships no gloo headers))"),
      PTRAIN_KEY("parallel", "reshard_after_forward", parallel.reshard_after_forward, kFromStruct,
                 R"(free gathered units after forward (ZeRO-3))"),
      PTRAIN_KEY(
          "parallel", "prefetch", parallel.prefetch, kFromStruct,
          R"(issue the next unit's all-gather before computing the current one (forward: unit i+1 during block i; backward: block i-1 during block i's backward), so communication overlaps compute and at most two gathered units are alive; `false` gathers each unit when it is needed)"),
      PTRAIN_KEY("parallel", "timeout_s", parallel.timeout_s, kFromStruct,
                 R"(seconds a collective may take before this rank declares a peer stuck and aborts the job (> 0))"),
      PTRAIN_KEY(
          "memory", "activation_checkpointing", memory.activation_checkpointing, kFromStruct,
          R"(`none`, or `full`: each block keeps only its input and is recomputed in backward (about one extra forward of compute; activation memory of one block plus the block inputs))"),
      PTRAIN_KEY(
          "memory", "activation_offloading", memory.activation_offloading,
          kFromStruct, R"(with `activation_checkpointing = "full"`: the input each block keeps goes to pinned host memory in forward (a side stream on CUDA, at most 2 copies in flight) and comes back ahead of the block's backward; the GPU keeps none of the block inputs. Refused (exit 2) without full checkpointing)"),
      PTRAIN_KEY("memory", "loss_chunk_tokens", memory.loss_chunk_tokens, kFromStruct,
                 R"(tokens per cross-entropy chunk; 0 picks ~512 MiB of float32 logits per chunk (1,046 tokens at Llama 3's 128,256-entry vocabulary); smaller chunks save memory but make the output projection's gradient GEMM memory-bound)"),
      PTRAIN_KEY("checkpoint", "dir", checkpoint.dir, R"(`<output_dir>/checkpoints`)",
                 R"(where `step_N/` directories go)"),
      PTRAIN_KEY("checkpoint", "every_steps", checkpoint.every_steps, kFromStruct,
                 R"(save every N steps; 0 saves only at the end)"),
      PTRAIN_KEY("checkpoint", "keep", checkpoint.keep, kFromStruct, R"(newest complete checkpoints kept (>= 1))"),
      PTRAIN_KEY(
          "checkpoint", "resume", checkpoint.resume, kFromStruct,
          R"(`""` fresh start, `"auto"` newest complete checkpoint in `checkpoint.dir` (fresh if none), or a `step_N` directory)"),
      PTRAIN_KEY("checkpoint", "save_final", checkpoint.save_final, kFromStruct, R"(save after the last step)"),
      PTRAIN_KEY("preference", "beta", preference.beta, kFromStruct,
                 R"(`dpo`, `kto`: how far the policy may move from the reference (higher: less; IPO's tau); `simpo`: the reward scale (> 0))"),
      PTRAIN_KEY(
          "preference", "loss_type", preference.loss_type, R"(`"sigmoid"` (`"kto"` for `kto`))",
          R"(`kto`: `kto` (KTO, its KL term estimated from mismatched completions of each micro-batch) or `apo_zero_unpaired` (APO-zero on unpaired completions, no KL), as TRL's `KTOConfig.loss_type`; `dpo`'s loss, one name or a list (their sum, each times its `loss_weights` entry), as TRL's `DPOConfig.loss_type` names them: `sigmoid` (DPO), `hinge` (SLiC), `ipo` (IPO, log-ratios averaged over each completion's tokens), `exo_pair` (EXO; `label_smoothing` its epsilon, > 0), `nca_pair` (NCA), `robust` (rDPO: `label_smoothing` is the chance a label is flipped), `bco_pair` (BCO), `sppo_hard` (SPPO), `aot` / `aot_unpaired` (AOT: log-ratios sorted within each micro-batch of a rank), `apo_zero` / `apo_down` (APO), `discopop` (DiscoPOP, `discopop_tau`), `sft` (the chosen completions' negative log-likelihood, a mean over all their tokens of the step), `sigmoid_norm` (`sigmoid` on per-token averages); e.g. `["sigmoid", "sft"]` is RPO (docs/preference.md))"),
      PTRAIN_KEY(
          "preference", "loss_weights", preference.loss_weights, kFromStruct,
          R"(`dpo`: one weight (>= 0) for each `loss_type` entry, in its order; `[]`: 1 each (TRL's `loss_weights`))"),
      PTRAIN_KEY(
          "preference", "label_smoothing", preference.label_smoothing, kFromStruct,
          R"(`dpo`: `robust`'s chance that a preference label is flipped, `exo_pair`'s epsilon (> 0 there; the EXO paper uses 1e-3), `aot`'s and `aot_unpaired`'s smoothing; `simpo` and `cpo`'s `sigmoid`: conservative smoothing; in [0, 0.5). Other losses read none (TRL's ignore it), so setting it there is refused)"),
      PTRAIN_KEY(
          "preference", "ld_alpha", preference.ld_alpha, kFromStruct,
          R"(`dpo`: LD-DPO's weight, in [0, 1], of each completion's tokens past the shorter completion's length of its pair, in the policy's and the reference's log-probabilities (TRL's `ld_alpha`; 1: no weighting, TRL's `None`))"),
      PTRAIN_KEY(
          "preference", "f_divergence_type", preference.f_divergence_type, kFromStruct,
          R"(`dpo`: the divergence from the reference (f-DPO; TRL's `f_divergence_type`): `reverse_kl` (DPO), `forward_kl`, `js_divergence`, `alpha_divergence`; other than `reverse_kl` only with the losses of the chosen-minus-rejected difference: `sigmoid`, `sigmoid_norm`, `hinge`, `ipo`, `exo_pair`, `robust`, `discopop`, `sft`)"),
      PTRAIN_KEY("preference", "f_alpha_divergence_coef", preference.f_alpha_divergence_coef, kFromStruct,
                 R"(`dpo` with `f_divergence_type = "alpha_divergence"`: its alpha)"),
      PTRAIN_KEY("preference", "discopop_tau", preference.discopop_tau, kFromStruct,
                 R"(`dpo` with the `discopop` loss: its temperature (> 0; the DiscoPOP paper's 0.05))"),
      PTRAIN_KEY(
          "preference", "use_weighting", preference.use_weighting, kFromStruct,
          R"(`dpo`: WPO's weighting (TRL's `use_weighting`) — each pair's loss times its two completions' weights, exp of the mean over a completion's tokens of log p(token) - log sum_v p_v^2 under the policy (no gradient through them); not with `aot` / `aot_unpaired` (they sort the pairs; TRL refuses them too) or `sft` (TRL weighs that batch mean by the batch's mean weight))"),
      PTRAIN_KEY(
          "preference", "cpo_alpha", preference.cpo_alpha, R"(`1` (`cpo`), `0` (`simpo`))",
          R"(`cpo`, `simpo`: the weight (>= 0) of the chosen completions' negative log-likelihood, a mean over all their tokens of the step, added to the loss (TRL's `cpo_alpha`; SimPO with it > 0 is CPO-SimPO))"),
      PTRAIN_KEY(
          "preference", "alpha", preference.alpha, kFromStruct,
          R"(`cpo`, `simpo`: AlphaPO's reward shape — each completion's reward (1 - p^-alpha) / alpha of its probability p (SimPO and `ipo`: of its per-token mean) in place of log p; 0: log p (TRL's `CPOConfig.alpha`))"),
      PTRAIN_KEY("preference", "desirable_weight", preference.desirable_weight, kFromStruct,
                 R"(`kto`: the weight (> 0) of the desirable completions' losses (TRL's `desirable_weight`; with unbalanced data, about undesirable / desirable examples))"),
      PTRAIN_KEY("preference", "undesirable_weight", preference.undesirable_weight, kFromStruct,
                 R"(`kto`: the weight (> 0) of the undesirable completions' losses (TRL's `undesirable_weight`))"),
      PTRAIN_KEY("preference", "gamma", preference.gamma, kFromStruct,
                 R"(`simpo`: the target reward margin (TRL's `simpo_gamma`))"),
      PTRAIN_KEY(
          "preference", "max_length", preference.max_length, kFromStruct,
          R"(ids per sequence, prompt + completion (TRL's `max_length`); a longer sequence keeps its first `max_length` ids (`data.truncation = "truncate"`) or its pair is left out (`"drop"`); a pair whose prompt alone fills it is left out, as TRL does. 0: `data.seq_len + 1`; at most that)"),
      PTRAIN_KEY(
          "preference", "precompute_ref_log_probs", preference.precompute_ref_log_probs, kFromStruct,
          R"(`dpo`, `kto`: score the reference once, before training, on every pair (KTO: every completion and its KL completion) (training and validation) and keep two numbers a pair (TRL's `precompute_ref_log_probs`): the model as loaded — the base, the loaded adapter, or for a full fine-tune the whole model, whose frozen copy would otherwise be needed — so each step saves the reference's forward. DPO of a full fine-tune sets it where the config does not (ptrain keeps no frozen copy of a whole model, and this gives its log-probabilities); `false` is refused there)"),
      PTRAIN_KEY(
          "preference", "ref_model", preference.ref_model, kFromStruct,
          R"(`dpo`, `kto`: another model as the reference (TRL's `ref_model`), a path as `model.hf_path` takes — a Hugging Face directory or a `.gguf` file of the policy's vocabulary, any shape —, built as the policy's base is (precision, `quant.base`, `model.gguf_reader`) and scored once before the policy is built (it sets `preference.precompute_ref_log_probs`: the same log-probabilities, one model in memory at a time; `false` is refused). Its tokenizer files are not read: the policy's tokenizer tokenizes the pairs for both, as TRL's `processing_class`. Empty: the model as loaded (the base with the adapters off, a loaded adapter as loaded, or a full fine-tune's starting weights))"),
      PTRAIN_KEY("lora", "enabled", lora.enabled, kFromStruct, R"(LoRA adapters over a frozen base)"),
      PTRAIN_KEY("lora", "rank", lora.rank, kFromStruct, R"(adapter rank (>= 1))"),
      PTRAIN_KEY("lora", "alpha", lora.alpha, kFromStruct, R"(scaling numerator (> 0))"),
      PTRAIN_KEY("lora", "dropout", lora.dropout, kFromStruct, R"(in [0, 1))"),
      PTRAIN_KEY(
          "lora", "rslora", lora.rslora, kFromStruct,
          R"(rank-stabilized LoRA: adapters scaled by `alpha / sqrt(rank)` instead of `alpha / rank` (PEFT's `use_rslora`))"),
      PTRAIN_KEY(
          "lora", "targets", lora.targets, kFromStruct,
          R"(among q, k, v, o, gate, up, down, output (`output`: `lm_head`, applied inside the chunked loss as h W^T + s (h A^T) B^T; refused for tied embeddings))"),
      PTRAIN_KEY(
          "lora", "adapter_path", lora.adapter_path, kFromStruct,
          R"(a PEFT adapter directory (`adapter_config.json` + `adapter_model.safetensors`, or `adapter_model.bin` as older PEFT saved it) to start from; its `r`, `lora_alpha` and target modules must equal `lora.rank`, `lora.alpha`, `lora.targets`)"),
      PTRAIN_KEY(
          "quant", "base", quant.base, kFromStruct,
          R"(`none` or `nf4`: every block's matrices as frozen NF4 weights (QLoRA; needs LoRA: a frozen base alone trains nothing). Must be `nf4` when `model.hf_path` is a bitsandbytes NF4 checkpoint)"),
      PTRAIN_KEY(
          "quant", "double_quant", quant.double_quant, kFromStruct,
          R"(quantize the NF4 absmax scales too; with a bitsandbytes NF4 checkpoint it must equal its `bnb_4bit_use_double_quant`)"),
      PTRAIN_KEY(
          "kernels", "fused_swiglu", kernels.fused_swiglu, kFromStruct,
          R"(SwiGLU's `silu(gate) * up` as one autograd function that keeps only gate and up (one `[tokens, ffn_dim]` activation less per block): one CUDA kernel each way on a GPU, LibTorch's own operations elsewhere — values and gradients equal to the composite path's bit for bit on the CPU (`docs/kernels.md`))"),
      PTRAIN_KEY(
          "kernels", "fused_grad_norm", kernels.fused_grad_norm, kFromStruct,
          R"(the gradient norm's sum of squares in one CUDA kernel per unit that reads the gradient in place, squaring and summing in float64 in an order fixed by its size — instead of LibTorch's float64 norm, which first makes a float64 copy of the gradient; the composite path on the CPU (`docs/kernels.md`))"),
      PTRAIN_KEY(
          "kernels", "fused_rope", kernels.fused_rope, kFromStruct,
          R"(RoPE's rotation of q and k as one autograd function: one CUDA kernel each way on a GPU (float32 arithmetic without fused multiply-adds, one rounding) instead of about ten LibTorch operations; LibTorch's own operations elsewhere — values and gradients equal to the composite path's bit for bit on the CPU (`docs/kernels.md`))"),
      PTRAIN_KEY(
          "kernels", "fused_loss", kernels.fused_loss, kFromStruct,
          R"(the loss head's softmax cross-entropy per logits chunk in one CUDA kernel — each row read once for its maximum and sum of exponentials, once more to write the gradient — instead of seven LibTorch passes over the `[chunk, vocab]` float32 logits; the output projection's GEMMs are unchanged. The composite path on the CPU (`docs/kernels.md`))"),
  };
  // clang-format on
  return kKeys;
}
#undef PTRAIN_KEY
#undef PTRAIN_DIM

const Key* find_key(const std::string& section, const std::string& name) {
  for (const auto& k : keys())
    if (k.section == section && k.name == name) return &k;
  return nullptr;
}

// "did you mean ...": the closest known name within a third of its length, or the same key
// name in another section.
std::string suggest(const std::string& section, const std::string& name) {
  std::vector<std::string> names;
  for (const auto& k : keys())
    if (k.section == section) names.push_back(k.name);
  if (const std::string best = closest(name, names); !best.empty())
    return "; did you mean " + section + "." + best + "?";
  for (const auto& k : keys())
    if (k.name == name) return "; did you mean " + k.full() + "?";
  return "";
}

std::string suggest_section(const std::string& section) {
  std::set<std::string> sections;
  for (const auto& k : keys()) sections.insert(k.section);
  const std::string best = closest(section, {sections.begin(), sections.end()});
  return best.empty() ? "" : "; did you mean [" + best + "]?";
}

// Converts a TOML node to the key's type; "" on success, else the reason.
std::string convert(const toml::node& node, Type type, Value& out) {
  switch (type) {
    case Type::Int:
      if (!node.is_integer()) break;
      out = node.value<int64_t>().value();
      return "";
    case Type::Float:
      if (!node.is_number()) break;
      out = node.value<double>().value();
      return "";
    case Type::Bool:
      if (!node.is_boolean()) break;
      out = node.value<bool>().value();
      return "";
    case Type::String:
      if (!node.is_string()) break;
      out = node.value<std::string>().value();
      return "";
    case Type::FloatList: {
      const auto* arr = node.as_array();
      if (!arr) break;
      std::vector<double> v;
      for (const auto& e : *arr) {
        if (!e.is_number()) return std::string("expected ") + type_name(type);
        v.push_back(e.value<double>().value());
      }
      out = v;
      return "";
    }
    case Type::Names:
      if (node.is_string()) {
        out = std::vector<std::string>{node.value<std::string>().value()};
        return "";
      }
      [[fallthrough]];
    case Type::StringList: {
      const auto* arr = node.as_array();
      if (!arr) break;
      std::vector<std::string> v;
      for (const auto& e : *arr) {
        if (!e.is_string()) return std::string("expected ") + type_name(type);
        v.push_back(e.value<std::string>().value());
      }
      out = v;
      return "";
    }
  }
  std::ostringstream got;
  got << node.type();
  return std::string("expected ") + type_name(type) + ", got " + got.str();
}

struct Assignment {
  const Key* key;
  Value value;
  Config::Origin origin;
};

// Collects typed assignments from a parsed TOML table; problems for unknown/mistyped keys.
void collect(const toml::table& root, const std::string& file, std::vector<Assignment>& out,
             std::vector<ConfigProblem>& problems) {
  for (auto&& [sec_key, sec_node] : root) {
    const std::string section(sec_key.str());
    const int sec_line = static_cast<int>(sec_key.source().begin.line);
    const auto* table = sec_node.as_table();
    if (!table) {
      problems.push_back({file, sec_line, section, "key outside any [section]" + suggest("", section)});
      continue;
    }
    bool known_section = false;
    for (const auto& k : keys()) known_section |= k.section == section;
    if (!known_section) {
      problems.push_back({file, sec_line, section, "unknown section [" + section + "]" + suggest_section(section)});
      continue;
    }
    for (auto&& [key, node] : *table) {
      const std::string name(key.str());
      const int line = static_cast<int>(node.source().begin.line);
      const Key* spec = find_key(section, name);
      if (!spec) {
        problems.push_back({file, line, section + "." + name, "unknown key" + suggest(section, name)});
        continue;
      }
      Value v;
      std::string why = convert(node, spec->type, v);
      if (!why.empty()) {
        problems.push_back({file, line, spec->full(), why});
        continue;
      }
      out.push_back({spec, v, {file, line}});
    }
  }
}

// `section.key=value`: value parsed as TOML, or taken as a bare string when it is not TOML.
void collect_override(const std::string& text, int index, std::vector<Assignment>& out,
                      std::vector<ConfigProblem>& problems) {
  const std::string origin = "--set";
  auto eq = text.find('=');
  auto dot = text.find('.');
  if (eq == std::string::npos || dot == std::string::npos || dot > eq) {
    problems.push_back({origin, index, text, "expected --set section.key=value"});
    return;
  }
  const std::string section = text.substr(0, dot);
  const std::string name = text.substr(dot + 1, eq - dot - 1);
  const std::string raw = text.substr(eq + 1);
  toml::table parsed;
  try {
    parsed = toml::parse("v = " + raw);
  } catch (const toml::parse_error&) {
    parsed = toml::table{{"v", raw}};
  }
  toml::table wrapped{{section, toml::table{}}};
  wrapped[section].as_table()->insert_or_assign(name, *parsed.get("v"));
  std::vector<ConfigProblem> local;
  std::vector<Assignment> parsed_here;
  collect(wrapped, origin, parsed_here, local);
  for (auto& p : local) {
    p.line = index;
    problems.push_back(p);
  }
  for (auto& a : parsed_here) {
    a.origin.line = index;
    out.push_back(a);
  }
}

// A value as `string` and `number` spell its strings and numbers; lists in brackets.
template <class String, class Number>
std::string render_value(const Value& v, const String& string, const Number& number) {
  return std::visit(
      [&](const auto& x) -> std::string {
        using T = std::decay_t<decltype(x)>;
        if constexpr (std::is_same_v<T, std::string>) {
          return string(x);
        } else if constexpr (std::is_same_v<T, bool>) {
          return x ? "true" : "false";
        } else if constexpr (std::is_same_v<T, double>) {
          return number(x);
        } else if constexpr (std::is_same_v<T, int64_t>) {
          return std::to_string(x);
        } else {
          std::string out = "[";
          for (size_t i = 0; i < x.size(); ++i) {
            if (i) out += ", ";
            if constexpr (std::is_same_v<T, std::vector<std::string>>)
              out += string(x[i]);
            else
              out += number(x[i]);
          }
          return out + "]";
        }
      },
      v);
}

// As TOML++ writes it (config.resolved.toml, check).
std::string format_value(const Value& v) {
  auto toml_text = [](const auto& x) {
    std::ostringstream out;
    out << toml::value<std::decay_t<decltype(x)>>(x);
    return out.str();
  };
  return render_value(v, toml_text, toml_text);
}

// As docs/config.md shows it: strings in double quotes, numbers in their shortest form (a float
// keeps its ".0").
std::string doc_value(const Value& v) {
  auto quoted = [](const std::string& x) { return "\"" + x + "\""; };
  auto shortest = [](double x) {
    std::array<char, 32> buf{};
    const auto r = std::to_chars(buf.data(), buf.data() + buf.size(), x);
    std::string s(buf.data(), r.ptr);
    const size_t e = s.find('e');
    if (e == std::string::npos) return s.find('.') == std::string::npos ? s + ".0" : s;  // a TOML float
    size_t digits = s.find_first_not_of("+-", e + 1);
    while (digits + 1 < s.size() && s[digits] == '0') s.erase(digits, 1);  // 3e-04 -> 3e-4
    return s;
  };
  return render_value(v, quoted, shortest);
}

}  // namespace

std::vector<std::string> known_keys() {
  std::vector<std::string> out;
  for (const auto& k : keys()) out.push_back(k.full());
  return out;
}

namespace {

// The file's and the overrides' key = value assignments, in order (a TOML syntax error ends the
// reading: nothing else could be checked reliably).
std::vector<Assignment> read_assignments(const std::string& path, const std::vector<std::string>& overrides,
                                         std::vector<ConfigProblem>& problems) {
  if (!fs::is_regular_file(path))
    throw ConfigError({{path, 0, "config", "no such config file; pass an existing TOML file to --config"}});
  std::vector<Assignment> assignments;
  try {
    toml::table root = toml::parse_file(path);
    collect(root, path, assignments, problems);
  } catch (const toml::parse_error& e) {
    problems.push_back({path, static_cast<int>(e.source().begin.line), "toml",
                        std::string(e.description()) + " (fix the TOML syntax)"});
    throw ConfigError(std::move(problems));
  }
  for (size_t i = 0; i < overrides.size(); ++i)
    collect_override(overrides[i], static_cast<int>(i + 1), assignments, problems);
  return assignments;
}

// Applies the assignments to a config, collecting the problems.
struct Assigner {
  Config& config;
  const std::vector<Assignment>& assignments;
  std::vector<ConfigProblem>& problems;

  void assign(const Assignment& a) const {
    try {
      a.key->set(config, a.value);
      config.origins[a.key->full()] = a.origin;
    } catch (const UnknownName& e) {
      problems.push_back({a.origin.file, a.origin.line, a.key->full(), e.what()});
    }
  }
  // A [model] dimension key the config sets.
  bool assigned(const char* name) const {
    return std::any_of(assignments.begin(), assignments.end(),
                       [&](const Assignment& a) { return a.key->model_dim && a.key->name == name; });
  }
  void problem(const std::string& key, const std::string& what) const {
    const auto o = config.origin(key);
    problems.push_back({o.file, o.line, key, what});
  }
};

// The model's shape from model.hf_path's config.json, or from its preset.
void resolve_shape(const Assigner& a) {
  Config& config = a.config;
  if (!config.model.hf_path.empty()) {
    try {
      config.model.shape = read_model_config(config.model.hf_path, config.model.gguf_reader);
      const bool gguf = !gguf_model_file(config.model.hf_path).empty();
      const HfStorage stored = gguf ? HfStorage{} : read_hf_storage(config.model.hf_path);
      config.model.hf_nf4 = stored.nf4;
      config.model.hf_nf4_double_quant = stored.double_quant;
      if (!gguf && config.model.gguf_reader != GgufReader::transformers)
        a.problem("model.gguf_reader", "is read for a GGUF model.hf_path only, and " + config.model.hf_path +
                                           " is a Hugging Face directory (its config.json decides); remove the key");
    } catch (const std::exception& e) {
      a.problem("model.hf_path", e.what());
    }
    return;
  }
  if (config.model.gguf_reader != GgufReader::transformers)
    a.problem("model.gguf_reader", "is read for a GGUF model.hf_path only; set model.hf_path or remove the key");
  if (auto shape = preset_shape(config.model.preset)) {
    config.model.shape = *shape;
  } else {
    std::string names;
    for (const auto& n : preset_names()) names += (names.empty() ? "" : ", ") + n;
    a.problem("model.preset",
              "unknown preset '" + config.model.preset + "'; use one of " + names + " or set model.hf_path");
  }
}

// Explicit per-dimension [model] keys, on top of a preset (refused with model.hf_path).
void assign_model_dims(const Assigner& a) {
  for (const auto& x : a.assignments) {
    if (!x.key->model_dim) continue;
    if (!a.config.model.hf_path.empty()) {
      a.problems.push_back({x.origin.file, x.origin.line, x.key->full(),
                            "the shape comes from model.hf_path's config.json; remove this key"});
      continue;
    }
    a.assign(x);
  }
}

// [model] RoPE scaling keys: YaRN's attention factor derived as config.json files derive it where
// they give none; a key the resolved scaling does not read is refused, not ignored, where it is
// set to anything but its default (a resolved TOML lists every key, at its default there).
void check_rope_scaling_keys(const Assigner& a) {
  RopeScaling& r = a.config.model.shape.rope_scaling;
  if (r.type == RopeType::yarn) r.attention_factor = RopeScaling::yarn_mscale(r.factor);
  const RopeScaling defaults;
  auto unread = [&](const char* name, bool is_default, const std::string& why) {
    if (a.assigned(name) && !is_default) a.problem(std::string("model.") + name, why);
  };
  const std::string type = std::string("model.rope_scaling_type is \"") + r.type_name() + "\"";
  // A preset's context is not the one YaRN stretches unless the config says so.
  if (r.factor > 0 && r.type == RopeType::yarn && !a.assigned("rope_original_max_seq_len"))
    a.problem("model.rope_scaling_type",
              "YaRN needs model.rope_original_max_seq_len: the context the model was pretrained for, "
              "which YaRN stretches by rope_scaling_factor");
  if (r.factor == 0)
    unread("rope_scaling_type", r.type == defaults.type,
           "no RoPE scaling applies while model.rope_scaling_factor is 0; set it (>= 1)");
  if (r.type != RopeType::llama3) {
    unread("rope_low_freq_factor", r.low_freq_factor == defaults.low_freq_factor,
           "is read by llama3 scaling only; " + type);
    unread("rope_high_freq_factor", r.high_freq_factor == defaults.high_freq_factor,
           "is read by llama3 scaling only; " + type);
  }
  if (r.type == RopeType::linear)
    unread("rope_original_max_seq_len", r.original_max_seq_len == defaults.original_max_seq_len,
           "is read by llama3 and yarn scaling only; " + type);
}

}  // namespace

namespace {

// preference.ref_model: readable, of the policy's vocabulary, and valid as a config of its own.
void check_reference(const Config& config, const Environment& env, std::vector<ConfigProblem>& problems) {
  if (config.preference.ref_model.empty() || !has_reference(config.training.objective)) return;
  const auto o = config.origin("preference.ref_model");
  const auto problem = [&](const std::string& what) {
    problems.push_back({o.file, o.line, "preference.ref_model", what});
  };
  Config ref;
  try {
    ref = reference_config(config);
  } catch (const std::exception& e) {
    problem(e.what());
    return;
  }
  if (ref.model.shape.vocab_size != config.model.shape.vocab_size) {
    problem(config.preference.ref_model + " has a vocabulary of " + std::to_string(ref.model.shape.vocab_size) +
            " ids, the policy " + std::to_string(config.model.shape.vocab_size) +
            ": the policy's tokenizer tokenizes the pairs once and both models score those ids (as TRL does); use "
            "a reference of the policy's vocabulary");
    return;
  }
  std::vector<ConfigProblem> own;
  validate(ref, env, own);
  for (const auto& p : own) problem("the reference, built as the policy's base is, breaks " + p.key + ": " + p.reason);
}

}  // namespace

Config reference_config(const Config& config) {
  Config ref = config;
  const std::string& path = config.preference.ref_model;
  ref.model.hf_path = path;
  ref.model.shape = read_model_config(path, config.model.gguf_reader);
  const HfStorage stored = gguf_model_file(path).empty() ? read_hf_storage(path) : HfStorage{};
  ref.model.hf_nf4 = stored.nf4;
  ref.model.hf_nf4_double_quant = stored.double_quant;
  ref.data.tokenizer = config.tokenizer_path();  // the policy's: it tokenizes the pairs for both
  ref.lora.adapter_path.clear();                 // the adapters stay off: the reference is the base
  ref.preference.ref_model.clear();
  ref.preference.precompute_ref_log_probs = true;
  return ref;
}

Config load_config(const std::string& path, const std::vector<std::string>& overrides, const Environment& env) {
  std::vector<ConfigProblem> problems;
  Config config;
  config.source_file = path;
  const std::vector<Assignment> assignments = read_assignments(path, overrides, problems);
  const Assigner a{config, assignments, problems};
  // Model shape: preset or hf_path first, then explicit per-dimension keys on top.
  for (const auto& x : assignments)
    if (!x.key->model_dim) a.assign(x);
  resolve_shape(a);
  // Without a shape the dimension rules would only echo the problem above.
  if (config.model.shape.dim == 0) throw ConfigError(std::move(problems));
  assign_model_dims(a);
  if (config.model.hf_path.empty()) check_rope_scaling_keys(a);
  // A resized preset derives head_dim from its new width; a preset's own head_dim (Qwen3's 128
  // whatever the width) stands unless dim or n_heads changes.
  auto& s = config.model.shape;
  if (!a.assigned("head_dim") && (a.assigned("dim") || a.assigned("n_heads")) && config.model.hf_path.empty() &&
      s.n_heads > 0)
    s.head_dim = s.dim / s.n_heads;
  // DPO of a full fine-tune: TRL keeps a frozen copy of the model as loaded; ptrain scores that
  // reference once instead (the same log-probabilities), unless the config says otherwise.
  if (has_reference(config.training.objective) && !config.lora.enabled &&
      !config.origins.count("preference.precompute_ref_log_probs"))
    config.preference.precompute_ref_log_probs = true;
  // KTO's loss: KTOConfig's default "kto"
  if (config.training.objective == Objective::kto && !config.origins.count("preference.loss_type"))
    config.preference.loss_type = {PreferenceLoss::kto};
  // CPO's behaviour-cloning weight: CPOConfig's default 1; SimPO is CPOTrainer's with 0.
  if (config.training.objective == Objective::cpo && !config.origins.count("preference.cpo_alpha"))
    config.preference.cpo_alpha = 1.0;
  // DPO against another model: scored once, before training, as TRL's precompute_ref_log_probs
  if (!config.preference.ref_model.empty() && has_reference(config.training.objective) &&
      !config.origins.count("preference.precompute_ref_log_probs"))
    config.preference.precompute_ref_log_probs = true;
  validate(config, env, problems);
  if (problems.empty()) check_reference(config, env, problems);
  if (!problems.empty()) throw ConfigError(std::move(problems));
  return config;
}

namespace {
constexpr const char* kReferenceIntro = R"(# ptrain configuration reference

A config is a TOML file; any key can be overridden with `--set section.key=value` (the
value is parsed as TOML, or taken as a bare string). `ptrain check --config F` prints the
fully resolved config and the plan. Unknown sections/keys, wrong types and rule violations
are all reported at once, each as

    error: FILE:LINE: section.key: reason (and the fix)

and the process exits with code 2 before anything is allocated. `FILE` is `--set` for
overrides (LINE is then the override's position on the command line); LINE 0 means the value
came from a default or preset. Relative paths are relative to the current directory.
This file is generated from the key table in `src/config/config.cpp`:
`ptrain --config-reference > docs/config.md` writes it, and the test
`Config.DocsAreGeneratedFromTheKeyTable` fails when the two differ.

)";

// Sections that open with a heading other than "## [section]" or with prose; a section not
// listed here continues the table above it when listed as "".
struct SectionDoc {
  const char* section;
  const char* heading;  // "" : no heading of its own (its rows join the previous table)
  const char* prose;
};
const SectionDoc kSectionDocs[] = {
    {"lora", "[lora] and [quant]",
     R"(LoRA over a frozen base runs through the same FSDP units: the base (embedding, blocks, head) is
frozen in the compute dtype with no gradients or optimizer state, and each block gets an adapter
unit (A [rank, in], B [out, rank] per target, PEFT's names and init) that is sharded, gathered,
reduce-scattered, optimized and checkpointed like a full model's units; `memory.json` reports the
base as `frozen_base_bytes`. With `quant.base = "nf4"` (QLoRA) every block's matrices are held
as NF4 (`nf4_params`, `nf4_bytes` in `memory.json`; ~0.516 B per weight with double
quantization), each projection quantized on its own as the HF checkpoint is read (as
bitsandbytes quantizes a Linear4bit; a bitsandbytes NF4 checkpoint's codes are taken as
stored), and sharded across the ranks like every unit (4-bit bytes on the wire). Activation checkpointing and offloading
work with both. `ptrain export` of a LoRA checkpoint writes the adapters in PEFT's format;
`lora.adapter_path` loads PEFT adapters. See docs/qlora.md.

)"},
    {"quant", "", ""},
    {"kernels", "[kernels]",
     R"(Fused implementations of the decoder's pieces, each a switch so one GPU run can race it against
the composite LibTorch path; each fused piece has a CPU reference that equals the composite path
(docs/kernels.md: what each fuses, its tolerance on a GPU, what has been raced). All on by default:
on an H200 they made Llama 3.2 1B mixed 1.20x faster together; on the CPU a switch changes no value.

)"},
};
}  // namespace

std::string config_reference() {
  std::ostringstream out;
  out << kReferenceIntro;
  std::string section;
  for (const auto& k : keys()) {
    if (k.section != section) {
      section = k.section;
      const SectionDoc* d = nullptr;
      for (const auto& s : kSectionDocs)
        if (section == s.section) d = &s;
      if (!d || *d->heading) {
        out << (section == keys().front().section ? "" : "\n") << "## " << (d ? d->heading : "[" + section + "]")
            << "\n"
            << (d ? d->prose : "") << "| key | default | meaning |\n|---|---|---|\n";
      }
    }
    std::string def = k.default_doc;
    if (def.empty()) def.append(1, '`').append(doc_value(k.get(Config{}))).append(1, '`');
    out << "| `" << k.full() << "` | " << def << " | " << k.doc << " |\n";
  }
  return out.str();
}

std::string to_toml(const Config& config) {
  std::ostringstream out;
  std::string section;
  for (const auto& k : keys()) {
    if (k.section != section) {
      section = k.section;
      out << (out.tellp() > 0 ? "\n" : "") << "[" << section << "]\n";
    }
    const bool from_hf = k.model_dim && !config.model.hf_path.empty();
    out << (from_hf ? "# (from hf_path) " : "") << k.name << " = " << format_value(k.get(config)) << "\n";
  }
  return out.str();
}

PrecisionPolicy precision_policy(const Config& c) {
  PrecisionPolicy p;
  p.mode = name_of(c.precision.mode);
  auto dtype = [](DtypeName name, c10::ScalarType fallback) {
    if (name == DtypeName::float32) return c10::kFloat;
    if (name == DtypeName::bfloat16) return c10::kBFloat16;
    return fallback;
  };
  const PrecisionMode mode = c.precision.mode;
  if (mode != PrecisionMode::fp32) p.logits_dtype = dtype(c.precision.logits_dtype, c10::kFloat);
  if (mode == PrecisionMode::mixed) {
    p.compute_dtype = dtype(c.precision.param_dtype, c10::kBFloat16);
    p.reduce_dtype = dtype(c.precision.reduce_dtype, c10::kFloat);
  } else if (mode == PrecisionMode::bf16) {
    p.master_dtype = p.compute_dtype = p.optim_dtype = c10::kBFloat16;
    p.reduce_dtype = dtype(c.precision.reduce_dtype, c10::kBFloat16);
    p.stochastic_rounding = c.precision.stochastic_rounding;
    p.kahan = c.precision.kahan_summation;
  }
  p.optim_8bit = c.optimizer.name == OptimizerName::adamw8bit;
  return p;
}

}  // namespace ptrain
