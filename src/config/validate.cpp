// Config validation: each section's own rules live beside its options struct (problems(): data/,
// model/, optim/, parallel/options.h); the rules here read several sections, the files a config
// names or the machine (kRules). A rule names the key it reports on and returns "" when
// satisfied, else the reason including the fix.
#include <torch/cuda.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "checkpoint/gguf_model.h"
#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "common/fs_util.h"
#include "config/config.h"
#include "data/parquet.h"
#include "data/samples.h"
#include "data/token_file.h"
#include "model/layout.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;

Environment Environment::detect() {
  Environment env;
  env.cuda_available = torch::cuda::is_available();
  return env;
}

namespace {

struct Rule {
  const char* key;
  std::function<std::string(const Config&, const Environment&)> check;
};

// Data file problems: existence, size, and (for token files) the header.
std::string check_data(const Config& c) {
  if (c.data.path.empty()) return "no data file; set data.path to a text file, a .bin token file or a .jsonl dataset";
  if (!fs::is_regular_file(c.data.path))
    return "no such file '" + c.data.path + "' (run launch/setup.sh to build the tiny corpus, or fix the path)";
  const int64_t window = c.data.seq_len + 1;
  if (c.data.format == DataFormat::tokens) {
    try {
      TokenFileHeader h = read_token_header(c.data.path);
      if (h.vocab_size > static_cast<uint64_t>(c.model.shape.vocab_size))
        return "token file vocabulary (" + std::to_string(h.vocab_size) + ") exceeds model.vocab_size (" +
               std::to_string(c.model.shape.vocab_size) + ")";
      if (static_cast<int64_t>(h.count) < 2 * window)
        return "token file holds " + std::to_string(h.count) + " tokens, fewer than two windows of seq_len+1";
    } catch (const std::exception& e) {
      return e.what();
    }
  } else if (holds_records(c.data.format)) {
    if (fs::file_size(c.data.path) == 0)
      return "'" + c.data.path +
             "' is empty; a dataset holds one record per line (JSONL), array element (JSON) or row (Parquet)";
    // A JSON array read as JSONL (or the other way round) fails at its first line: say which it is.
    if (c.data.format == DataFormat::jsonl || c.data.format == DataFormat::json) {
      std::ifstream in(c.data.path, std::ios::binary);
      char first = 0;
      while (in.get(first) && (first == ' ' || first == '\t' || first == '\r' || first == '\n')) {
      }
      if (c.data.format == DataFormat::jsonl && first == '[')
        return "'" + c.data.path +
               "' starts with '[': it holds one JSON array of records, which data.format = \"json\" reads "
               "(\"jsonl\" is one record per line)";
      if (c.data.format == DataFormat::json && first == '{')
        return "'" + c.data.path +
               "' starts with '{', not '[': records one per line are data.format = \"jsonl\" (\"json\" reads one "
               "JSON array of records)";
    }
    if (c.data.format == DataFormat::parquet && !parquet_supported())
      return "this ptrain was built without Parquet support (no pyarrow in the build's venv); run launch/setup.sh, "
             "which "
             "installs it, and rebuild";
  } else if (static_cast<int64_t>(fs::file_size(c.data.path)) < 2 * window) {
    return "text file is shorter than two windows of seq_len+1 bytes";
  }
  return "";
}

// data.cache (`dir` false) or data.cache_dir (`dir` true): set only where JSONL / Parquet samples
// are cached.
std::string cache_problem(const Config& c, bool dir) {
  const bool set = dir ? !c.data.cache_dir.empty() : !c.data.cache;
  if (!set) return "";
  if (!holds_records(c.data.format))
    return std::string("applies to data.format = \"jsonl\", \"json\" or \"parquet\" only (text and token files ") +
           (dir ? "need no cache)" : "are mapped as they are, never tokenized at start)");
  return dir && !c.data.cache ? "is unused with data.cache = false: set one or the other" : "";
}

// The shape's ranges, checked before every other rule: the others, and all that follows
// validation, size loops and tables by the shape, so a value far out of range (a damaged
// config.json, a typo) is reported alone instead of hanging them.
const std::vector<Rule>& shape_rules() {
  static constexpr const char* kAbove = "larger than any model ptrain is built for (a damaged config.json, a typo?)";
  auto rule = [](const char* key, int64_t LlamaShape::*field, int64_t min, int64_t max) {
    return Rule{key,
                [=](const Config& c, const Environment&) { return within(c.model.shape.*field, min, max, kAbove); }};
  };
  static const std::vector<Rule> kRules = {
      rule("model.dim", &LlamaShape::dim, 1, kMaxWidth),
      rule("model.n_layers", &LlamaShape::n_layers, 1, kMaxLayers),
      rule("model.n_heads", &LlamaShape::n_heads, 1, kMaxWidth),
      rule("model.n_kv_heads", &LlamaShape::n_kv_heads, 1, kMaxWidth),
      rule("model.head_dim", &LlamaShape::head_dim, 1, kMaxWidth),
      rule("model.ffn_dim", &LlamaShape::ffn_dim, 1, kMaxWidth),
      rule("model.vocab_size", &LlamaShape::vocab_size, 2, kMaxVocab),
      rule("model.max_seq_len", &LlamaShape::max_seq_len, 1, kMaxPositions),
      {"model.head_dim",
       [](const Config& c, const Environment&) -> std::string {
         const auto& s = c.model.shape;  // each factor is within kMaxWidth here: no overflow
         return s.n_heads > kMaxWidth || s.head_dim > kMaxWidth
                    ? ""
                    : within(s.q_dim(), 1, kMaxWidth,
                             "n_heads × head_dim is larger than any model ptrain is built for");
       }},
  };
  return kRules;
}

const std::vector<Rule>& rules() {
  static const std::vector<Rule> kRules = {
      {"run.name",
       [](const Config& c, const Environment&) -> std::string {
         return c.run.name.empty() || c.run.name.find('/') != std::string::npos
                    ? "must be a non-empty name without '/' (use run.output_dir for paths)"
                    : "";
       }},
      {"run.seed", [](const Config& c, const Environment&) -> std::string { return at_least(c.run.seed, 0); }},
      {"model.init_std", [](const Config& c, const Environment&) -> std::string { return positive(c.model.init_std); }},
      {"model.dim",
       [](const Config& c, const Environment&) -> std::string {
         const auto& s = c.model.shape;
         if (s.n_heads < 1 || !c.model.hf_path.empty() || s.dim % s.n_heads == 0) return std::string();
         const FamilyTraits& f = traits(s.family);
         if (f.heads_divide_width)  // what ptrain exports must load in transformers
           return "dim (" + std::to_string(s.dim) + ") must be divisible by n_heads (" + std::to_string(s.n_heads) +
                  "): transformers' " + f.architecture + " refuses any other width, head_dim notwithstanding";
         return c.is_set("model.head_dim") ? ""
                                           : "dim (" + std::to_string(s.dim) + ") must be divisible by n_heads (" +
                                                 std::to_string(s.n_heads) + "), or set model.head_dim";
       }},
      {"model.n_kv_heads",
       [](const Config& c, const Environment&) -> std::string {
         const auto& s = c.model.shape;
         if (s.n_kv_heads < 1) return std::string();
         return s.n_heads % s.n_kv_heads == 0
                    ? ""
                    : "n_heads (" + std::to_string(s.n_heads) + ") must be a multiple of n_kv_heads (" +
                          std::to_string(s.n_kv_heads) + ")";
       }},
      {"model.head_dim",
       [](const Config& c, const Environment&) -> std::string {
         return c.model.shape.head_dim >= 2 && c.model.shape.head_dim % 2 == 0
                    ? ""
                    : "head_dim must be even and >= 2 (RoPE rotates pairs)";
       }},
      {"model.rope_theta",
       [](const Config& c, const Environment&) -> std::string { return positive(c.model.shape.rope_theta); }},
      {"model.norm_eps",
       [](const Config& c, const Environment&) -> std::string { return positive(c.model.shape.norm_eps); }},
      {"model.attention_bias",
       [](const Config& c, const Environment&) -> std::string {
         const FamilyTraits& f = traits(c.model.shape.family);
         const bool read = f.qkv_bias == BiasRule::attention_bias || f.o_bias == BiasRule::attention_bias;
         return !c.model.shape.attention_bias || read
                    ? ""
                    : std::string("family ") + f.name + " has no attention_bias flag (docs/models.md)";
       }},
      {"model.mlp_bias",
       [](const Config& c, const Environment&) -> std::string {
         const FamilyTraits& f = traits(c.model.shape.family);
         return !c.model.shape.mlp_bias || f.mlp_bias == BiasRule::mlp_bias
                    ? ""
                    : std::string("family ") + f.name + " has no mlp_bias flag (docs/models.md)";
       }},
      {"model.hf_path",
       [](const Config& c, const Environment& env) -> std::string {
         // The weights as training will load them, headers only: every tensor present, consumed,
         // of its shape and a float dtype; the shard index consistent with the files.
         if (c.model.hf_path.empty() || !env.local) return "";
         try {
           if (const std::string gguf = gguf_model_file(c.model.hf_path); !gguf.empty())
             GgufModel(gguf, c.model.gguf_reader).verify();
           else
             verify_hf_tensors(HfCheckpoint(c.model.hf_path, c.model.shape.tie_embeddings), c.model.shape,
                               HfStorage{c.model.hf_nf4, c.model.hf_nf4_double_quant}, false);
         } catch (const std::exception& e) {
           return e.what();
         }
         return "";
       }},
      {"model.rope_scaling_factor",
       [](const Config& c, const Environment&) -> std::string {
         const auto& r = c.model.shape.rope_scaling;
         if (r.factor == 0) return std::string();
         if (r.factor < 1) return std::string("must be 0 (off) or >= 1");
         switch (r.type) {
           case RopeType::llama3:
             return r.high_freq_factor > r.low_freq_factor && r.original_max_seq_len > 0
                        ? ""
                        : "needs rope_high_freq_factor > rope_low_freq_factor and rope_original_max_seq_len > 0";
           case RopeType::linear:
             return "";
           case RopeType::yarn:
             if (r.original_max_seq_len <= 0) return "YaRN needs an original context length > 0";
             if (!(c.model.shape.rope_theta > 1)) return "YaRN needs rope_theta > 1 (its ramp divides by log(theta))";
             return r.beta_slow > 0 && r.beta_fast >= r.beta_slow && r.attention_factor > 0
                        ? ""
                        : "YaRN needs beta_fast >= beta_slow > 0 and an attention factor > 0";
         }
         return "";
       }},
      {"data.path",
       [](const Config& c, const Environment& env) -> std::string { return env.local ? check_data(c) : ""; }},
      {"data.format",
       [](const Config& c, const Environment&) -> std::string {
         return c.data.format == DataFormat::text && c.model.shape.vocab_size < 256
                    ? "text is tokenized to bytes (256 symbols) but model.vocab_size is " +
                          std::to_string(c.model.shape.vocab_size)
                    : "";
       }},
      {"data.tokenizer",
       [](const Config& c, const Environment& env) -> std::string {
         if (!holds_records(c.data.format))
           return !c.data.tokenizer.empty() ? "applies to data.format = \"jsonl\", \"json\" or \"parquet\" only (token "
                                              "files are tokenized already; "
                                              "text is read as bytes)"
                                            : "";
         if (!env.local) return "";  // --plan: no files are read
         if (c.tokenizer_path().empty())
           return "data.format = \"" + name_of(c.data.format) +
                  "\" needs a tokenizer: set data.tokenizer to a tokenizer.json (or the HF model "
                  "directory holding it), or model.hf_path to a model directory that has one";
         try {
           const Tokenizer tok(c.tokenizer_path());
           if (tok.vocab_size() > c.model.shape.vocab_size)
             return "the tokenizer's ids reach " + std::to_string(tok.vocab_size() - 1) + " but model.vocab_size is " +
                    std::to_string(c.model.shape.vocab_size) + "; use the model's own tokenizer";
         } catch (const std::exception& e) {
           return e.what();
         }
         return "";
       }},
      {"data.fields",
       [](const Config& c, const Environment&) -> std::string {
         for (const auto& f : c.data.fields) {
           const auto eq = f.find('=');
           const std::string canonical = f.substr(0, eq);
           const auto& known = record_fields();
           if (eq == std::string::npos || eq + 1 == f.size())
             return "'" + f + "' is not \"canonical=theirs\" (e.g. \"output=answer\")";
           if (std::find(known.begin(), known.end(), canonical) == known.end()) {
             std::string names;  // the list record_fields() holds, not a copy of it that can fall behind
             for (const auto& k : known) names += (names.empty() ? "" : ", ") + k;
             return "'" + canonical + "' is not a record field (" + names + ")";
           }
         }
         return !c.data.fields.empty() && !holds_records(c.data.format)
                    ? "applies to data.format = \"jsonl\", \"json\" or \"parquet\" only"
                    : "";
       }},
      {"data.ignore_fields",
       [](const Config& c, const Environment&) -> std::string {
         for (const auto& f : c.data.ignore_fields) {
           if (f.empty()) return "a field name is empty";
           for (const auto& renamed : c.data.fields)
             if (renamed.substr(renamed.find('=') + 1) == f)
               return "'" + f + "' is also renamed by data.fields ('" + renamed +
                      "'): read it or leave it out, not both";
         }
         return !c.data.ignore_fields.empty() && !holds_records(c.data.format)
                    ? "applies to data.format = \"jsonl\", \"json\" or \"parquet\" only"
                    : "";
       }},
      {"data.packing",
       [](const Config& c, const Environment&) -> std::string {
         return c.data.packing && !holds_records(c.data.format)
                    ? "applies to data.format = \"jsonl\", \"json\" or \"parquet\" only (token streams already fill "
                      "every row)"
                    : "";
       }},
      {"data.train_on_prompt",
       [](const Config& c, const Environment&) -> std::string {
         return c.data.train_on_prompt && !holds_records(c.data.format)
                    ? "applies to data.format = \"jsonl\", \"json\" or \"parquet\" only (text and token files train on "
                      "every "
                      "token)"
                    : "";
       }},
      {"data.truncation",
       [](const Config& c, const Environment&) -> std::string {
         return c.data.truncation == Truncation::drop && !holds_records(c.data.format)
                    ? "applies to data.format = \"jsonl\", \"json\" or \"parquet\" only (token streams are cut into "
                      "windows)"
                    : "";
       }},
      {"data.cache", [](const Config& c, const Environment&) -> std::string { return cache_problem(c, false); }},
      {"data.cache_dir", [](const Config& c, const Environment&) -> std::string { return cache_problem(c, true); }},
      {"data.seq_len", [](const Config& c, const Environment&) -> std::string { return at_least(c.data.seq_len, 1); }},
      {"data.seq_len",
       [](const Config& c, const Environment&) -> std::string {
         return c.data.seq_len <= c.model.shape.max_seq_len
                    ? ""
                    : "seq_len (" + std::to_string(c.data.seq_len) + ") exceeds model.max_seq_len (" +
                          std::to_string(c.model.shape.max_seq_len) + ")";
       }},
  };
  // (Two lists: clang-format 14 mis-wraps lambdas deep inside a very long braced list.)
  static const std::vector<Rule> kTrainingRules = {
      {"training.steps",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.steps, 1); }},
      {"training.grad_accum_steps",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.grad_accum_steps, 1); }},
      {"training.max_grad_norm",
       [](const Config& c, const Environment&) -> std::string {
         return c.training.max_grad_norm >= 0 ? "" : "must be >= 0 (0 disables clipping)";
       }},
      {"training.log_every",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.log_every, 1); }},
      {"training.eval_every",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.eval_every, 0); }},
      {"training.sample_prompts",
       [](const Config& c, const Environment&) -> std::string {
         if (c.training.sample_prompts.empty()) return "";
         if (c.training.eval_every <= 0) return "samples are taken at each evaluation: set training.eval_every > 0";
         for (const auto& p : c.training.sample_prompts)
           if (p.empty()) return "a sample prompt is empty";
         return c.tokenizer_path().empty() ? "needs a tokenizer: set data.tokenizer (or model.hf_path)" : "";
       }},
      {"training.sample_tokens",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.sample_tokens, 1); }},
      {"training.token_metrics",
       [](const Config& c, const Environment&) -> std::string {
         return !c.training.token_metrics && is_preference(c.training.objective)
                    ? "applies to training.objective = \"sft\" (a preference objective's metrics come with its "
                      "loss); remove the key"
                    : "";
       }},
      {"training.sample_chat",
       [](const Config& c, const Environment&) -> std::string {
         return c.training.sample_chat && c.training.sample_prompts.empty() ? "applies to training.sample_prompts" : "";
       }},
      {"training.eval_batches",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.eval_batches, 1); }},
      {"training.threads",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.threads, 0); }},
      {"training.profile_steps",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.training.profile_steps, 0); }},
      {"training.profile_start",
       [](const Config& c, const Environment&) -> std::string {
         if (c.training.profile_steps <= 0)
           return c.training.profile_start != Config{}.training.profile_start
                      ? "applies to training.profile_steps (0: nothing is traced)"
                      : "";
         if (c.training.profile_start < 1) return at_least(c.training.profile_start, 1);
         const int64_t last = c.training.profile_start + c.training.profile_steps - 1;
         return last <= c.training.steps
                    ? ""
                    : "steps " + std::to_string(c.training.profile_start) + " to " + std::to_string(last) +
                          " are traced but training.steps is " + std::to_string(c.training.steps);
       }},
      {"training.device",
       [](const Config& c, const Environment& env) -> std::string {
         return c.training.device == DeviceChoice::cuda && env.local && !env.cuda_available
                    ? "\"cuda\" requested but no CUDA GPU is visible; use \"cpu\" or \"auto\""
                    : "";
       }},
      {"optimizer.in_backward",
       [](const Config& c, const Environment&) -> std::string {
         return c.optimizer.in_backward && c.training.grad_accum_steps > 1
                    ? "stepping during backward cannot accumulate gradients; set training.grad_accum_steps = 1 or "
                      "in_backward = false"
                    : "";
       }},
      {"optimizer.in_backward",
       [](const Config& c, const Environment&) -> std::string {
         return c.optimizer.in_backward && c.training.max_grad_norm > 0
                    ? "global-norm clipping needs every gradient before any step; set training.max_grad_norm = 0 or "
                      "in_backward = false"
                    : "";
       }},
      {"precision.kahan_summation",
       [](const Config& c, const Environment&) -> std::string {
         // (Its mode and stochastic rounding: PrecisionOptions::problems.)
         if (!c.precision.kahan_summation || c.precision.mode != PrecisionMode::bf16 || c.precision.stochastic_rounding)
           return "";
         if (c.optimizer.name != OptimizerName::adamw)
           return "Kahan summation is implemented for optimizer.name = \"adamw\" only";
         return "";
       }},
      {"parallel.backend",
       [](const Config& c, const Environment& env) -> std::string {
         const bool cpu = c.training.device == DeviceChoice::cpu ||
                          (c.training.device == DeviceChoice::automatic && env.local && !env.cuda_available);
         return c.parallel.backend == Backend::nccl && cpu
                    ? "nccl needs CUDA tensors but training runs on the CPU; use \"auto\" or \"mpi\""
                    : "";
       }},
      {"checkpoint.every_steps",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.checkpoint.every_steps, 0); }},
      {"checkpoint.keep",
       [](const Config& c, const Environment&) -> std::string { return at_least(c.checkpoint.keep, 1); }},
      {"checkpoint.resume",
       [](const Config& c, const Environment& env) -> std::string {
         const auto& r = c.checkpoint.resume;
         if (r.empty() || r == "auto" || !env.local) return std::string();
         return fs::is_regular_file(fs::path(r) / "meta.json")
                    ? ""
                    : "'" + r +
                          "' is not a complete checkpoint directory (no meta.json); use "
                          "\"auto\" or a step_N directory";
       }},
      {"lora.targets",
       [](const Config& c, const Environment&) -> std::string {
         std::string names;
         for (const auto& known : lora_targets()) names += (names.empty() ? "" : ", ") + std::string(known.name);
         for (const auto& t : c.lora.targets)
           if (peft_module(t).empty()) return "unknown target '" + t + "'; use " + names;
         return std::string();
       }},
      {"lora.targets",
       [](const Config& c, const Environment&) -> std::string {
         const auto& t = c.lora.targets;
         return c.lora.enabled && c.model.shape.tie_embeddings && std::find(t.begin(), t.end(), "output") != t.end()
                    ? "this model ties its output projection to the "
                      "embedding; adapt other projections (drop \"output\")"
                    : "";
       }},
      {"lora.targets",
       [](const Config& c, const Environment&) -> std::string {
         return c.lora.enabled && c.lora.targets.empty()
                    ? "LoRA with no targets trains nothing; list some of q, k, v, o, gate, up, down"
                    : "";
       }},
      {"lora.adapter_path",
       [](const Config& c, const Environment& env) -> std::string {
         if (c.lora.adapter_path.empty()) return "";
         if (!c.lora.enabled) return "only used with LoRA; set lora.enabled = true or remove it";
         if (!env.local) return "";
         try {  // adapter_config.json as PEFT writes it, every key accounted for (checkpoint/peft.h)
           const PeftAdapter p = read_peft_config(c.lora.adapter_path, c.model.shape);
           if (p.rank != c.lora.rank)
             return "the adapter has rank " + std::to_string(p.rank) + "; set lora.rank to match";
           if (p.alpha != c.lora.alpha)
             return "the adapter has lora_alpha " + std::to_string(p.alpha) + "; set lora.alpha to match";
           if (p.rslora != c.lora.rslora)
             return std::string("the adapter ") + (p.rslora ? "uses" : "does not use") +
                    " rsLoRA (use_rslora); set lora.rslora to match";
           std::vector<std::string> want = c.lora.targets, have = p.targets;
           std::sort(want.begin(), want.end());
           std::sort(have.begin(), have.end());
           if (want != have) {
             std::string names;
             for (const auto& t : p.targets) names += (names.empty() ? "" : ", ") + t;
             return "the adapter targets " + names + "; set lora.targets to the same";
           }
         } catch (const std::exception& e) {
           return e.what();
         }
         return "";
       }},
      {"quant.base",
       [](const Config& c, const Environment&) -> std::string {
         if (c.model.hf_nf4 && c.quant.base != QuantBase::nf4)
           return "model.hf_path holds bitsandbytes NF4 weights (its config.json's quantization_config); set "
                  "quant.base = \"nf4\" to train adapters on them as stored, or use the unquantized model";
         return c.quant.base == QuantBase::nf4 && !c.lora.enabled
                    ? "an NF4 base is frozen, so nothing would train; set lora.enabled = true or quant.base = "
                      "\"none\""
                    : "";
       }},
      {"quant.double_quant",
       [](const Config& c, const Environment&) -> std::string {
         if (!c.model.hf_nf4 || c.quant.base != QuantBase::nf4 || c.quant.double_quant == c.model.hf_nf4_double_quant)
           return "";
         return std::string("model.hf_path's NF4 statistics are ") + (c.model.hf_nf4_double_quant ? "" : "not ") +
                "double-quantized (bnb_4bit_use_double_quant); set quant.double_quant = " +
                (c.model.hf_nf4_double_quant ? "true" : "false") + " to load them as stored";
       }},
      // training.objective and [preference] (model/objective.h)
      {"training.objective",
       [](const Config& c, const Environment&) -> std::string {
         if (!is_preference(c.training.objective)) return "";
         const std::string name = name_of(c.training.objective);
         if (!holds_records(c.data.format))
           return name +
                  " trains on {prompt, chosen, rejected} records: set data.format to \"jsonl\", \"json\" or "
                  "\"parquet\" (docs/preference.md)";
         if (c.data.packing) return name + " scores each sequence whole, one a row: set data.packing = false";
         if (c.data.train_on_prompt)
           return name + " scores the completions only (TRL's completion mask): set data.train_on_prompt = false";
         if (c.training.objective == Objective::kto && c.data.truncation == Truncation::drop)
           return "kto cuts each example and KL sequence to max_length (TRL's collator); it drops none but those "
                  "whose prompt alone fills it: set data.truncation = \"truncate\"";
         if (c.training.objective == Objective::kto && c.preference.reads(PreferenceLoss::kto) &&
             c.data.micro_batch_size < 2)
           return "kto estimates its KL term from the other completions of each micro-batch, and a micro-batch of " +
                  std::to_string(c.data.micro_batch_size) +
                  " has none (TRL refuses it too): set data.micro_batch_size >= 2, or preference.loss_type = "
                  "\"apo_zero_unpaired\"";
         return "";
       }},
      {"preference.precompute_ref_log_probs",
       [](const Config& c, const Environment&) -> std::string {
         if (has_reference(c.training.objective) && !c.lora.enabled && !c.preference.precompute_ref_log_probs)
           return name_of(c.training.objective) +
                  " of a full fine-tune compares it with the model as loaded, and ptrain keeps no frozen copy of "
                  "a whole model to run beside it each step: remove the key (the reference is then scored once, "
                  "before training — the same log-probabilities, two numbers a pair), or set lora.enabled = true "
                  "(the reference is the base with the adapters off), or use the reference-free "
                  "training.objective = \"simpo\"";
         return "";
       }},
      {"preference.beta",
       [](const Config& c, const Environment&) -> std::string {
         return c.preference.beta > 0 && std::isfinite(c.preference.beta) ? "" : "must be > 0 (TRL's default is 0.1)";
       }},
      {"preference.loss_type",
       [](const Config& c, const Environment&) -> std::string {
         const auto& l = c.preference.loss_type;
         if ((c.training.objective == Objective::simpo || c.training.objective == Objective::orpo) &&
             l != PreferenceOptions{}.loss_type)
           return "is DPO's or CPO's loss; " + name_of(c.training.objective) + " has its own: remove it";
         if (l.empty()) return "names no loss: give one, e.g. \"sigmoid\"";
         const bool kto_loss = std::any_of(l.begin(), l.end(), [](PreferenceLoss x) {
           return x == PreferenceLoss::kto || x == PreferenceLoss::apo_zero_unpaired;
         });
         if (c.training.objective == Objective::kto && (l.size() != 1 || !kto_loss))
           return "KTO (TRL's KTOTrainer) takes one loss: \"kto\" or \"apo_zero_unpaired\"";
         if (c.training.objective != Objective::kto && kto_loss)
           return "\"kto\" and \"apo_zero_unpaired\" are KTO's losses: set training.objective = \"kto\"";
         if (c.training.objective == Objective::cpo &&
             (l.size() != 1 ||
              (l[0] != PreferenceLoss::sigmoid && l[0] != PreferenceLoss::hinge && l[0] != PreferenceLoss::ipo)))
           return "CPO (TRL's CPOTrainer) takes one loss: \"sigmoid\", \"hinge\" or \"ipo\" (its \"simpo\" is "
                  "training.objective = \"simpo\")";
         if (c.training.objective == Objective::dpo && c.preference.reads(PreferenceLoss::exo_pair) &&
             c.preference.label_smoothing == 0.0)
           return "exo_pair needs preference.label_smoothing > 0 (EXO's epsilon; the EXO paper uses 1e-3)";
         return "";
       }},
      {"preference.loss_weights",
       [](const Config& c, const Environment&) -> std::string {
         const PreferenceOptions& p = c.preference;
         if (p.loss_weights.empty()) return "";
         if (c.training.objective != Objective::dpo)
           return "weighs DPO's losses; " + name_of(c.training.objective) + " reads none: remove it";
         if (p.loss_weights.size() != p.loss_type.size())
           return "holds " + std::to_string(p.loss_weights.size()) + " weights for " +
                  std::to_string(p.loss_type.size()) + " preference.loss_type entries: give one for each";
         for (double w : p.loss_weights)
           if (!std::isfinite(w) || w < 0) return "must be finite and >= 0 (a negative weight maximizes its loss)";
         return "";
       }},
      {"preference.label_smoothing",
       [](const Config& c, const Environment&) -> std::string {
         const PreferenceOptions& p = c.preference;
         const double e = p.label_smoothing;
         const bool dpo = c.training.objective == Objective::dpo;
         if (e == 0.0) return "";
         if (!(e > 0.0 && e < 0.5)) return "must be in [0, 0.5)";
         const bool read = p.reads(PreferenceLoss::robust) || p.reads(PreferenceLoss::exo_pair) ||
                           p.reads(PreferenceLoss::aot) || p.reads(PreferenceLoss::aot_unpaired);
         if (dpo && !read)
           return "no DPO loss of preference.loss_type reads label smoothing (TRL's ignore it); use \"robust\" "
                  "for noisy labels, or remove it";
         if (c.training.objective == Objective::orpo || c.training.objective == Objective::kto)
           return name_of(c.training.objective) + " reads no label smoothing (TRL's " +
                  (c.training.objective == Objective::orpo ? "ORPOTrainer" : "KTOTrainer") + " has none): remove it";
         if (c.training.objective == Objective::cpo && (p.reads(PreferenceLoss::hinge) || p.reads(PreferenceLoss::ipo)))
           return "CPO's " + name_of(p.loss_type.at(0)) +
                  " loss reads no label smoothing (TRL's ignores it): use loss_type \"sigmoid\", or remove it";
         return "";
       }},
      {"preference.ld_alpha",
       [](const Config& c, const Environment&) -> std::string {
         const double a = c.preference.ld_alpha;
         if (!(a >= 0.0 && a <= 1.0)) return "must be in [0, 1] (1: no weighting)";
         if (c.training.objective != Objective::dpo && a != 1.0)
           return "weighs DPO's log-probabilities; " + name_of(c.training.objective) + " reads none: remove it";
         return "";
       }},
      {"preference.f_divergence_type",
       [](const Config& c, const Environment&) -> std::string {
         const PreferenceOptions& p = c.preference;
         if (p.f_divergence_type == FDivergence::reverse_kl) return "";
         if (c.training.objective != Objective::dpo)
           return "is DPO's; " + name_of(c.training.objective) + " reads none: remove it";
         for (PreferenceLoss l : p.loss_type)
           if (l == PreferenceLoss::nca_pair || l == PreferenceLoss::bco_pair || l == PreferenceLoss::sppo_hard ||
               l == PreferenceLoss::aot || l == PreferenceLoss::aot_unpaired || l == PreferenceLoss::apo_zero ||
               l == PreferenceLoss::apo_down)
             return "applies to the losses of the chosen-minus-rejected difference (sigmoid, sigmoid_norm, hinge, "
                    "ipo, exo_pair, robust, discopop, sft), not to " +
                    name_of(l) + " (TRL refuses it too): use \"reverse_kl\" or another loss";
         return "";
       }},
      {"preference.f_alpha_divergence_coef",
       [](const Config& c, const Environment&) -> std::string {
         const PreferenceOptions& p = c.preference;
         if (!std::isfinite(p.f_alpha_divergence_coef)) return "must be a finite number";
         return p.f_alpha_divergence_coef != PreferenceOptions{}.f_alpha_divergence_coef &&
                        p.f_divergence_type != FDivergence::alpha_divergence
                    ? "is read only with preference.f_divergence_type = \"alpha_divergence\": set that or remove it"
                    : "";
       }},
      {"preference.discopop_tau",
       [](const Config& c, const Environment&) -> std::string {
         const PreferenceOptions& p = c.preference;
         if (!(p.discopop_tau > 0) || !std::isfinite(p.discopop_tau)) return "must be > 0 (the paper's 0.05)";
         return p.discopop_tau != PreferenceOptions{}.discopop_tau &&
                        !(c.training.objective == Objective::dpo && p.reads(PreferenceLoss::discopop))
                    ? "is read only by the discopop loss: add \"discopop\" to preference.loss_type or remove it"
                    : "";
       }},
      {"preference.use_weighting",
       [](const Config& c, const Environment&) -> std::string {
         const PreferenceOptions& p = c.preference;
         if (!p.use_weighting || !is_preference(c.training.objective)) return "";
         if (c.training.objective != Objective::dpo)
           return "is DPOTrainer's WPO weighting; " + name_of(c.training.objective) + " reads none: remove it";
         if (p.reads(PreferenceLoss::aot) || p.reads(PreferenceLoss::aot_unpaired))
           return "cannot weigh aot / aot_unpaired, which sort the pairs apart from their weights (TRL refuses "
                  "it too): use another loss or remove it";
         if (p.reads(PreferenceLoss::sft))
           return "with the sft loss TRL weighs the batch's mean NLL by the batch's mean pair weight, which no "
                  "sum over pairs gives once a step spans several micro-batches or ranks: drop \"sft\" or this key";
         return "";
       }},
      {"preference.cpo_alpha",
       [](const Config& c, const Environment&) -> std::string {
         const double a = c.preference.cpo_alpha;
         if (!(a >= 0.0) || !std::isfinite(a)) return "must be finite and >= 0";
         if (c.training.objective == Objective::orpo && a != 0.0)
           return "is CPOTrainer's; ORPO's NLL has no weight (ORPOTrainer's is 1; beta weighs the odds ratio): "
                  "remove it";
         if (c.training.objective == Objective::kto && a != 0.0)
           return "is CPOTrainer's behaviour-cloning weight; KTO reads none: remove it";
         return c.training.objective == Objective::dpo && a != 0.0
                    ? "is CPOTrainer's behaviour-cloning weight; DPO's is the \"sft\" loss: add it to "
                      "preference.loss_type (with loss_weights) and remove this key"
                    : "";
       }},
      {"preference.alpha",
       [](const Config& c, const Environment&) -> std::string {
         const double a = c.preference.alpha;
         if (!std::isfinite(a)) return "must be a finite number (0: log-probability rewards)";
         return is_preference(c.training.objective) && !is_cpo_trainer(c.training.objective) && a != 0.0
                    ? "is AlphaPO's reward shape, which TRL's CPOTrainer reads (training.objective = \"cpo\" or "
                      "\"simpo\"); " +
                          name_of(c.training.objective) + " reads none: remove it"
                    : "";
       }},
      {"preference.desirable_weight",
       [](const Config& c, const Environment&) -> std::string {
         const double w = c.preference.desirable_weight;
         if (!(w > 0) || !std::isfinite(w)) return "must be finite and > 0";
         return is_preference(c.training.objective) && c.training.objective != Objective::kto && w != 1.0
                    ? "weighs KTO's desirable completions; " + name_of(c.training.objective) + " reads none: remove it"
                    : "";
       }},
      {"preference.undesirable_weight",
       [](const Config& c, const Environment&) -> std::string {
         const double w = c.preference.undesirable_weight;
         if (!(w > 0) || !std::isfinite(w)) return "must be finite and > 0";
         return is_preference(c.training.objective) && c.training.objective != Objective::kto && w != 1.0
                    ? "weighs KTO's undesirable completions; " + name_of(c.training.objective) +
                          " reads none: remove it"
                    : "";
       }},
      {"preference.max_length",
       [](const Config& c, const Environment&) -> std::string {
         const int64_t L = c.preference.max_length;
         if (L == 0) return "";
         if (L < 2 || L > c.data.seq_len + 1)
           return "must be 0 or in [2, data.seq_len + 1 = " + std::to_string(c.data.seq_len + 1) +
                  "]: a row holds seq_len + 1 ids; raise data.seq_len to hold longer sequences";
         return "";
       }},
  };
  static const std::vector<Rule> kAll = [] {
    std::vector<Rule> all = kRules;
    all.insert(all.end(), kTrainingRules.begin(), kTrainingRules.end());
    // a [preference] key given a value for a run that trains "sft" would be silently unused (the
    // default is what every resolved config writes)
    const PreferenceOptions d;
    const auto differs = [d](const std::string& key, const Config& c) {
      const PreferenceOptions& p = c.preference;
      if (key == "preference.beta") return p.beta != d.beta;
      if (key == "preference.loss_type") return p.loss_type != d.loss_type;
      if (key == "preference.loss_weights") return p.loss_weights != d.loss_weights;
      if (key == "preference.label_smoothing") return p.label_smoothing != d.label_smoothing;
      if (key == "preference.ld_alpha") return p.ld_alpha != d.ld_alpha;
      if (key == "preference.f_divergence_type") return p.f_divergence_type != d.f_divergence_type;
      if (key == "preference.f_alpha_divergence_coef") return p.f_alpha_divergence_coef != d.f_alpha_divergence_coef;
      if (key == "preference.discopop_tau") return p.discopop_tau != d.discopop_tau;
      if (key == "preference.gamma") return p.gamma != d.gamma;
      if (key == "preference.cpo_alpha") return p.cpo_alpha != d.cpo_alpha;
      if (key == "preference.alpha") return p.alpha != d.alpha;
      if (key == "preference.precompute_ref_log_probs") return p.precompute_ref_log_probs;
      if (key == "preference.use_weighting") return p.use_weighting;
      if (key == "preference.ref_model") return !p.ref_model.empty();
      if (key == "preference.desirable_weight") return p.desirable_weight != d.desirable_weight;
      if (key == "preference.undesirable_weight") return p.undesirable_weight != d.undesirable_weight;
      return p.max_length != d.max_length;
    };
    for (const char* key :
         {"preference.beta", "preference.loss_type", "preference.loss_weights", "preference.label_smoothing",
          "preference.ld_alpha", "preference.f_divergence_type", "preference.f_alpha_divergence_coef",
          "preference.discopop_tau", "preference.gamma", "preference.cpo_alpha", "preference.alpha",
          "preference.max_length", "preference.precompute_ref_log_probs", "preference.use_weighting",
          "preference.ref_model", "preference.desirable_weight", "preference.undesirable_weight"})
      all.push_back(
          {key, [key, differs](const Config& c, const Environment&) -> std::string {
             return !is_preference(c.training.objective) && differs(key, c)
                        ? "applies to the preference objectives (dpo, simpo, cpo, orpo, kto); this run trains "
                          "\"sft\": set the objective or remove the key"
                        : "";
           }});
    all.push_back({"preference.precompute_ref_log_probs", [](const Config& c, const Environment&) -> std::string {
                     return is_preference(c.training.objective) && !has_reference(c.training.objective) &&
                                    c.preference.precompute_ref_log_probs
                                ? name_of(c.training.objective) + " has no reference to score: remove it"
                                : "";
                   }});
    all.push_back({"preference.ref_model", [](const Config& c, const Environment&) -> std::string {
                     if (c.preference.ref_model.empty() || !is_preference(c.training.objective)) return "";
                     if (!has_reference(c.training.objective))
                       return name_of(c.training.objective) + " has no reference: remove it";
                     if (!c.preference.precompute_ref_log_probs)
                       return "is scored once, before the policy is built (ptrain keeps one model in memory at a "
                              "time; the same log-probabilities as scoring it each step), and "
                              "preference.precompute_ref_log_probs = false asks otherwise: remove that key";
                     return "";
                   }});
    all.push_back({"preference.gamma", [differs](const Config& c, const Environment&) -> std::string {
                     return is_preference(c.training.objective) && c.training.objective != Objective::simpo &&
                                    differs("preference.gamma", c)
                                ? "is SimPO's target margin; " + name_of(c.training.objective) +
                                      " reads none: remove it"
                                : "";
                   }});
    return all;
  }();
  return kAll;
}

}  // namespace

void validate(const Config& config, const Environment& env, std::vector<ConfigProblem>& out) {
  auto report = [&](const std::string& key, const std::string& reason) {
    const auto o = config.origin(key);
    out.push_back({o.file, o.line, key, reason});
  };
  // Each section's own rules, beside its options struct.
  for (const OptionProblems& section :
       {config.data.problems(), config.optimizer.problems(), config.lr_schedule.problems(), config.precision.problems(),
        config.parallel.problems(), config.memory.problems(), config.lora.problems()})
    for (const auto& p : section.list()) report(p.key, p.reason);
  const size_t before = out.size();
  for (const auto& rule : shape_rules()) {
    const std::string reason = rule.check(config, env);
    if (!reason.empty()) report(rule.key, reason);
  }
  if (out.size() > before) return;
  for (const auto& rule : rules()) {
    const std::string reason = rule.check(config, env);
    if (!reason.empty()) report(rule.key, reason);
  }
}

}  // namespace ptrain
