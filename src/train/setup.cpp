#include "train/setup.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <numeric>
#include <optional>
#include <thread>

#include "checkpoint/gguf_model.h"
#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "common/alloc_meter.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "data/dataset.h"
#include "data/rows.h"
#include "data/sample_cache.h"
#include "data/samples.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "parallel/precision.h"
#include "parallel/weights.h"
#include "tokenizer/tokenizer.h"
#include "train/preference.h"

namespace ptrain {

namespace fs = std::filesystem;

c10::Device resolve_device(const Config& c, const DistEnv& env) {
  if (!(c.training.device == DeviceChoice::cuda ||
        (c.training.device == DeviceChoice::automatic && torch::cuda::is_available())))
    return c10::Device(c10::kCPU);
  const auto gpus = static_cast<int>(torch::cuda::device_count());
  if (env.local_rank >= gpus)
    throw UsageError("rank " + std::to_string(env.rank) + " is local rank " + std::to_string(env.local_rank) +
                     " on its node, which shows " + std::to_string(gpus) +
                     " CUDA device(s): each rank trains on the GPU of its local rank, so launch at most " +
                     std::to_string(gpus) + " ranks per node (or make more GPUs visible: CUDA_VISIBLE_DEVICES)");
#ifdef PTRAIN_CUDA
  // The rank's GPU is the current device from here on, so nothing it creates without naming a
  // device (pinned host buffers, events, library handles) opens a context on GPU 0.
  c10::cuda::set_device(static_cast<c10::DeviceIndex>(env.local_rank));
#endif
  return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
}

std::shared_ptr<Collectives> connect(const Config& c, const DistEnv& env, const c10::Device& device) {
  log::set_rank(env.rank, env.world_size);
  if (device.is_cpu()) {
    if (c.training.threads > 0) {
      at::set_num_threads(static_cast<int>(c.training.threads));
    } else if (env.world_size > 1) {
      // Ranks on one node share its cores.
      const char* local = std::getenv("OMPI_COMM_WORLD_LOCAL_SIZE");
      const int per_node = local ? std::max(1, std::atoi(local)) : env.world_size;
      at::set_num_threads(std::max(1, static_cast<int>(std::thread::hardware_concurrency()) / per_node));
    }
  }
  return make_collectives(env, c.parallel.backend, device, c.parallel.timeout_s);
}

FsdpOptions fsdp_options(const Config& c) { return FsdpOptions{c.parallel, c.memory, c.kernels}; }

ModelPlan model_plan(const Config& c) {
  const PrecisionPolicy policy = precision_policy(c);
  return ModelPlan::make(c.model.shape,
                         PlanOptions{c.model.init_std, policy.master_dtype, policy.compute_dtype, c.lora, c.quant});
}

std::unique_ptr<FsdpModel> build_model(const Config& c, const c10::Device& device, std::shared_ptr<Collectives> comm) {
  auto model =
      std::make_unique<FsdpModel>(model_plan(c), precision_policy(c), device, std::move(comm), fsdp_options(c));
  if (!c.model.hf_path.empty()) {
    if (const std::string note = model_ignored_note(c.model.hf_path, c.model.gguf_reader);
        !note.empty() && model->comm().rank() == 0)
      log::info(note);
    if (const std::string gguf = gguf_model_file(c.model.hf_path); !gguf.empty()) {
      MeterScope scope;
      const GgufModel file(gguf, c.model.gguf_reader);
      file.verify();
      load_weights(*model, file.by_name());  // each tensor dequantized to float32 as it is copied
      if (model->comm().rank() == 0)
        log::info("loaded ", gguf, " (GGUF, dequantized one tensor at a time): peak host allocation during the load ",
                  log::bytes(static_cast<double>(scope.meter().peak.load())));
    } else {
      MeterScope scope;  // host allocations during the load: the full-precision model must never be among them
      const HfCheckpoint ckpt(c.model.hf_path, c.model.shape.tie_embeddings);
      const HfStorage stored{c.model.hf_nf4, c.model.hf_nf4_double_quant};
      verify_hf_tensors(ckpt, c.model.shape, stored, /*compare_values=*/true);
      if (stored.nf4)  // bitsandbytes' own codes and statistics, bit for bit: nothing requantized
        load_weights(*model, ckpt.by_name(), [&](const std::string& name, const std::vector<int64_t>& shape) {
          return read_bnb_nf4(ckpt, name, shape, stored.double_quant);
        });
      else
        load_weights(*model, ckpt.by_name());
      if (const std::string note = ckpt.renamed_note(); !note.empty() && model->comm().rank() == 0) log::info(note);
      if (const std::string note = hf_untied_note(c.model.hf_path, c.model.shape.tie_embeddings);
          !note.empty() && model->comm().rank() == 0)
        log::info(note);
      if (c.lora.enabled)
        log::info("loaded ", c.model.hf_path,
                  (stored.nf4                       ? " (bitsandbytes NF4 as stored)"
                   : c.quant.base == QuantBase::nf4 ? " (NF4, one projection at a time)"
                                                    : ""),
                  ": peak host allocation during the load ", log::bytes(static_cast<double>(scope.meter().peak.load())),
                  " (the checkpoint's full-precision weights: ",
                  log::bytes(4.0 * static_cast<double>(model->plan().num_params())), " in float32)");
    }
    init_adapters(*model, static_cast<uint64_t>(c.run.seed));
  } else {
    init_weights(*model, static_cast<uint64_t>(c.run.seed));
  }
  if (!c.lora.adapter_path.empty()) load_adapters(*model, read_peft(c.lora.adapter_path, c.model.shape).tensors);
  return model;
}

at::Tensor score_ref_model(const Config& c, const c10::Device& device, std::shared_ptr<Collectives> comm,
                           const PairedRows& data) {
  const Config ref = reference_config(c);
  const bool print = comm->rank() == 0;
  if (print)
    log::info("preference.ref_model: the reference is ", ref.model.hf_path, " (", ref.model.shape.n_layers,
              " layers, width ", ref.model.shape.dim, "); its tokenizer files are not read (the policy's tokenizer ",
              "tokenizes the pairs for both, as TRL's processing_class)");
  const auto t0 = std::chrono::steady_clock::now();
  const auto model = build_model(ref, device, std::move(comm));
  const PreferenceObjective objective{c.training.objective, c.preference, nullptr};
  at::Tensor logps = precompute_reference(*model, data, c.data.micro_batch_size, c.memory.loss_chunk_tokens, objective);
  if (print)
    log::info("reference log-probabilities of ", logps.size(0), " pairs scored by ", ref.model.hf_path, " in ",
              log::fixed(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2),
              " s (preference.ref_model); it is freed before the policy is built");
  return logps;
}

namespace {

std::string percent(double fraction) { return log::fixed(100.0 * fraction, 1) + "%"; }

RunData token_stream(const Config& c, bool eval_only) {
  auto data = std::make_shared<TokenData>(c.data.path, name_of(c.data.format));
  if (data->vocab_size() > c.model.shape.vocab_size)
    throw RuntimeError("'" + c.data.path + "' has vocabulary " + std::to_string(data->vocab_size()) +
                       " > model.vocab_size (" + std::to_string(c.model.shape.vocab_size) + ")");
  const int64_t T = c.data.seq_len;
  const Split train = eval_only ? Split{0, 0} : train_split(*data, c.data.val_fraction, T);
  const Split val = eval_only ? Split{0, data->size()} : val_split(*data, c.data.val_fraction, T);
  RunData d;
  d.rows = std::make_unique<TokenRows>(data, train, val, T, static_cast<uint64_t>(c.run.seed));
  d.report.push_back("data: " + c.data.path + ": " + log::grouped(static_cast<double>(data->size())) +
                     " tokens (train " + log::grouped(static_cast<double>(train.size())) + ", validation " +
                     log::grouped(static_cast<double>(val.size())) + ") | " +
                     log::grouped(static_cast<double>(d.rows->train_fill().rows)) + " training windows of " +
                     std::to_string(T + 1) + " tokens per epoch, " +
                     log::grouped(static_cast<double>(d.rows->val_rows())) + " validation windows");
  return d;
}

// data.path's samples: mapped from the sample cache (built by rank 0 when missing or stale,
// then mapped by every rank), or tokenized into memory when data.cache is off.
//
// While rank 0 tokenizes into the cache the other ranks wait for it in a series of short
// collectives, one after each block of records at most every 2 s (or timeout_s / 4), each
// carrying rank 0's state — so a long build never runs into parallel.timeout_s, which still
// catches a rank 0 that died.
class SampleLoader {
 public:
  SampleLoader(const Config& c, const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o,
               Collectives* comm, const c10::Device& device)
      : c_(c), tok_(tok), format_(format), o_(o), comm_(comm), device_(device), rank_(comm ? comm->rank() : 0) {}

  // The samples, and how they were had (`how`).
  std::shared_ptr<const SampleSet> load(std::string& how) {
    if (!c_.data.cache) {
      auto set = std::make_shared<SampleSet>(
          SampleSet::from_file(c_.data.path, c_.data.format, tok_, format_, o_, progress()));
      how = tokenized(*set) + ", held in memory (data.cache = false)";
      return set;
    }
    key_ = sample_cache_key(c_.data.cache_dir.empty() ? default_sample_cache_dir() : c_.data.cache_dir, c_.data.path,
                            c_.data.format, tok_, format_, o_);
    std::string failure;
    bool cache_failed = false;  // the cache could not be written, rather than the data read
    if (rank_ == 0)
      failure = build_on_rank0(how, cache_failed);
    else if (waited_for())
      wait_for_rank0();
    // Then the other ranks map rank 0's cache (or build their own where it is not visible: a
    // node-local cache directory).
    if (cache_failed) throw CacheWriteError(failure);
    if (!failure.empty()) throw RuntimeError(failure);
    if (rank_ != 0) open_or_build(how);
    return std::make_shared<SampleSet>(std::move(*set_));
  }

 private:
  enum : int64_t { kBuilding = 1, kDone = 2, kFailed = 3 };

  double seconds() const { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count(); }
  bool waited_for() const { return comm_ && comm_->world_size() > 1; }
  int64_t state_of_rank0(int64_t state) const { return sum_over_ranks(*comm_, rank_ == 0 ? state : 0, device_); }

  // Logs the tokenizing's progress at most once a second; on rank 0 while the others wait, beats.
  SampleProgress progress() {
    return [this](int64_t done, int64_t total, int64_t ids) {
      if (beating_ && seconds() - last_beat_ >= std::min(2.0, c_.parallel.timeout_s / 4)) {
        last_beat_ = seconds();
        state_of_rank0(kBuilding);
      }
      if (seconds() - last_log_ < 1.0 || done == total) return;
      last_log_ = seconds();
      log::info("tokenizing ", c_.data.path, ": ", percent(static_cast<double>(done) / static_cast<double>(total)),
                " | ", log::grouped(static_cast<double>(ids)), " tokens | ",
                log::grouped(static_cast<double>(ids) / last_log_), " tokens/s");
    };
  }

  std::string tokenized(const SampleSet& set) const {
    const double took = seconds();
    return "in " + log::fixed(took, 2) + " s (" +
           log::grouped(static_cast<double>(set.total_ids()) / std::max(took, 1e-9)) + " tokens/s, " +
           std::to_string(o_.threads) + (o_.threads == 1 ? " thread)" : " threads)");
  }

  void open_or_build(std::string& how) {
    std::string why;
    set_ = open_sample_cache(key_, c_.data.path, &why);
    if (set_) {
      how = "mapped from the cache " + key_.path + " in " + log::fixed(seconds(), 2) + " s";
      return;
    }
    if (!why.empty()) log::warn("sample cache ", why, "; tokenizing again");
    if (rank_ != 0 && why.empty())
      log::warn("the sample cache rank 0 wrote (", key_.path,
                ") is not visible on this rank (data.cache_dir is not "
                "shared by the nodes); tokenizing here");
    set_ = build_sample_cache(key_, c_.data.path, c_.data.format, tok_, format_, o_, progress());
    how = tokenized(*set_) + " into the cache " + key_.path + " (" +
          log::bytes(static_cast<double>(fs::file_size(key_.path))) + ")";
  }

  // Rank 0 maps or builds the cache, beating while the others wait, and tells them how it went.
  // Returns the failure ("" when none): any failure must reach the other ranks, not leave them
  // waiting.
  std::string build_on_rank0(std::string& how, bool& cache_failed) {
    std::string failure;
    beating_ = waited_for();
    try {
      open_or_build(how);
    } catch (const CacheWriteError& e) {
      failure = e.what();
      cache_failed = true;
    } catch (const std::exception& e) {
      failure = e.what();
    }
    beating_ = false;
    if (waited_for()) state_of_rank0(failure.empty() ? kDone : kFailed);
    return failure;
  }

  void wait_for_rank0() const {
    int64_t state = kBuilding;
    while (state == kBuilding) state = state_of_rank0(0);
    if (state != kDone) throw RuntimeError("rank 0 could not read it (its error says why)");
  }

  const Config& c_;
  const Tokenizer& tok_;
  const ChatFormat& format_;
  const SampleOptions& o_;
  Collectives* comm_;
  const c10::Device& device_;
  const int rank_;
  const std::chrono::steady_clock::time_point t0_ = std::chrono::steady_clock::now();
  double last_log_ = 0, last_beat_ = 0;
  bool beating_ = false;  // rank 0, building while the others wait
  SampleCacheKey key_;
  std::optional<SampleSet> set_;
};

std::shared_ptr<const SampleSet> load_samples(const Config& c, const Tokenizer& tok, const ChatFormat& format,
                                              const SampleOptions& o, Collectives* comm, const c10::Device& device,
                                              std::string& how) {
  return SampleLoader(c, tok, format, o, comm, device).load(how);
}

// The end of a data report's length line: prompts that are no prefix of their sequences, and
// records skipped.
std::string record_notes(const SampleStats& st) {
  const auto n = [](int64_t v) { return log::grouped(static_cast<double>(v)); };
  return (st.prompt_diverged ? " | prompt not a prefix of prompt + completion (the completion starts where they part, "
                               "as in TRL): " +
                                   n(st.prompt_diverged)
                             : std::string()) +
         (st.skipped_bad
              ? " | malformed, skipped (data.on_bad_record): " + n(st.skipped_bad) + ", the first: " + st.first_bad
              : std::string());
}

// Preference pairs (training.objective dpo / simpo) as rows, and what the log says of them.
RunData preference_pairs(const Config& c, const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o,
                         const std::shared_ptr<const SampleSet>& set, SampleSplit split, const std::string& how) {
  const SampleStats& st = set->stats;
  const auto n = [](int64_t v) { return log::grouped(static_cast<double>(v)); };
  auto rows = std::make_unique<PairRows>(set, split, c.data.seq_len, static_cast<uint64_t>(c.run.seed));
  RunData d;
  d.report.push_back(
      "data: " + c.data.path + ": " + n(st.records) + " preference records (" + n(st.text) + " text, " + n(st.chat) +
      " chat) tokenized as TRL's " + (o.trl.cpo ? "CPOTrainer" : "DPOTrainer") + " does with " + tok.path() +
      (st.chat ? ", chats as " + chat_template_names()[static_cast<size_t>(format.kind)] + " renders them (" +
                     format.source + ")"
               : std::string()) +
      (st.text || o.trl.cpo ? ", completions ending with eos_token " + o.trl.eos : std::string()) + ", " + how);
  d.report.push_back("pairs: " + n(st.pairs) + " (train " + n(static_cast<int64_t>(split.train.size())) +
                     ", validation " + n(static_cast<int64_t>(split.val.size())) + ") | " + n(set->total_ids()) +
                     " tokens | scored (completions) " + n(set->total_trained()) + " = " +
                     percent(static_cast<double>(set->total_trained()) /
                             static_cast<double>(std::max<int64_t>(1, set->total_ids() - set->size()))) +
                     " of the predicted tokens");
  d.report.push_back("longer than max_length = " + std::to_string(o.max_ids) + " ids: " + n(st.truncated) +
                     " pairs truncated, " + n(st.dropped_too_long) +
                     " dropped (data.truncation) | prompt alone fills max_length: " + n(st.dropped_prompt_fills) +
                     " pairs dropped" + record_notes(st));
  const RowFill tf = rows->train_fill(), vf = rows->val_fill();
  const int64_t T = c.data.seq_len;
  d.report.push_back("padding (one sequence per row, chosen and rejected): " + n(tf.rows) + " training rows of " +
                     std::to_string(T) + " per epoch, " + percent(tf.fraction(T)) + " filled | " + n(vf.rows) +
                     " validation rows, " + percent(vf.fraction(T)) + " filled");
  d.rows = std::move(rows);
  return d;
}

// KTO's examples (training.objective kto) as rows, and what the log says of them.
RunData kto_examples(const Config& c, const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o,
                     const std::shared_ptr<const SampleSet>& set, const SampleSplit& split, const std::string& how) {
  const SampleStats& st = set->stats;
  const auto n = [](int64_t v) { return log::grouped(static_cast<double>(v)); };
  const int64_t records = kto_records(*set);
  if (st.pairs > 0 && st.pairs < records)
    throw RuntimeError("'" + c.data.path +
                       "' mixes paired records ({prompt, chosen, rejected}) with unpaired ones "
                       "({prompt, completion, label}): TRL's KTOTrainer reads one kind a dataset (it unpairs a "
                       "paired dataset whole); unpair the paired records in the file, or split it in two");
  auto rows = std::make_unique<KtoRows>(set, split, c.data.seq_len, o.max_ids, c.data.micro_batch_size);
  RunData d;
  d.report.push_back("data: " + c.data.path + ": " + n(st.records) + " KTO records (" + n(st.text) + " text, " +
                     n(st.chat) + " chat" + (st.pairs ? ", paired: unpaired as TRL does" : std::string()) +
                     ") tokenized as TRL's KTOTrainer does with " + tok.path() +
                     (st.chat ? ", chats as " + chat_template_names()[static_cast<size_t>(format.kind)] +
                                    " renders them (" + format.source + ")"
                              : std::string()) +
                     (st.text ? ", completions ending with eos_token " + o.trl.eos : std::string()) + ", " + how);
  d.report.push_back("examples: " + n(st.desirable + st.undesirable) + " (" + n(st.desirable) + " desirable, " +
                     n(st.undesirable) + " undesirable) | train " + n(rows->train_examples()) + ", validation " +
                     n(rows->val_rows()) + " | " + n(set->total_ids()) +
                     " tokens | KL completions: each "
                     "micro-batch's completions rotated by one (data.micro_batch_size = " +
                     std::to_string(c.data.micro_batch_size) + "), read in file order, unshuffled");
  d.report.push_back("longer than max_length = " + std::to_string(o.max_ids) + " ids: " + n(rows->truncated()) +
                     " sequences (examples and KL sequences) truncated | prompt alone fills max_length: " +
                     n(rows->dropped_prompt_fills()) + " examples dropped" + record_notes(st));
  // TRL's advice where the labels are unbalanced (KTOTrainer._prepare_dataset, the KTO paper's
  // eq. 8): desirable_weight x desirable ~ undesirable_weight x undesirable, within 4:3
  const double good = static_cast<double>(std::max<int64_t>(rows->train_desirable(), 1));
  const double bad = static_cast<double>(std::max<int64_t>(rows->train_examples() - rows->train_desirable(), 1));
  const double dw = c.preference.desirable_weight, uw = c.preference.undesirable_weight;
  const auto round2 = [](double v) { return std::round(v * 100) / 100; };
  const double d_lo = round2(bad * uw / good), d_hi = round2(bad * uw / good * 1.33);
  const double u_lo = round2(good * dw / bad / 1.33), u_hi = round2(good * dw / bad);
  if (good != bad && !(d_lo <= dw && dw <= d_hi) && !(u_lo <= uw && uw <= u_hi))
    d.report.push_back("labels: " + n(rows->train_desirable()) + " desirable, " +
                       n(rows->train_examples() - rows->train_desirable()) +
                       " undesirable training examples, and the weights do not balance them (TRL's advice): set "
                       "EITHER preference.desirable_weight in [" +
                       log::fixed(d_lo, 2) + ", " + log::fixed(d_hi, 2) + "] OR preference.undesirable_weight in [" +
                       log::fixed(u_lo, 2) + ", " + log::fixed(u_hi, 2) + "]");
  const RowFill tf = rows->train_fill();
  d.report.push_back("padding (one sequence per row, each example and its KL sequence): " + n(tf.rows) +
                     " training rows of " + std::to_string(c.data.seq_len) + " per epoch, " +
                     percent(tf.fraction(c.data.seq_len)) + " filled");
  d.rows = std::move(rows);
  return d;
}

RunData jsonl_samples(const Config& c, Collectives* comm, const c10::Device& device, bool eval_only) {
  const Tokenizer tok(c.tokenizer_path());
  if (comm == nullptr || comm->rank() == 0) log::info("tokenizer ", tok.path(), ": ", tok.reading());
  const ChatFormat format = data_chat_format(tok, c.data.chat_template);
  SampleOptions o;
  const bool pairs = is_preference(c.training.objective);
  o.max_ids = pairs && c.preference.max_length > 0 ? c.preference.max_length : c.data.seq_len + 1;
  o.preference = pairs;
  o.trl.cpo = tokenized_as_cpo(c.training.objective);
  o.trl.kto = c.training.objective == Objective::kto;
  if (tok.template_tokens()) std::tie(o.trl.bos, o.trl.eos) = *tok.template_tokens();
  o.drop_too_long = c.data.truncation == Truncation::drop;
  o.train_on_prompt = c.data.train_on_prompt;
  o.skip_bad_records = c.data.on_bad_record == BadRecord::skip;
  for (const auto& f : c.data.fields) o.fields.emplace_back(f.substr(0, f.find('=')), f.substr(f.find('=') + 1));
  o.ignore_fields = c.data.ignore_fields;
  o.threads = usable_cpus();
  std::string how;
  const std::shared_ptr<const SampleSet> set = load_samples(c, tok, format, o, comm, device, how);
  const SampleStats& st = set->stats;
  if (set->size() == 0) {
    const char* empty = c.data.format == DataFormat::json      ? " (the array holds no element)"
                        : c.data.format == DataFormat::parquet ? " (the file holds no row)"
                                                               : " (the file holds only blank lines)";
    throw RuntimeError("'" + c.data.path + "' has no usable sample: " + std::to_string(st.records) + " records, " +
                       std::to_string(st.dropped_too_long) + " longer than seq_len+1 = " + std::to_string(o.max_ids) +
                       " tokens and dropped, " + std::to_string(st.dropped_untrained) + " with nothing to train" +
                       (st.records == 0 ? empty : ""));
  }
  if (set->max_id() >= c.model.shape.vocab_size)
    throw RuntimeError("'" + c.data.path + "' tokenizes to id " + std::to_string(set->max_id()) +
                       " but model.vocab_size is " + std::to_string(c.model.shape.vocab_size) +
                       "; use the model's own tokenizer");
  SampleSplit split;
  // samples, pairs of them, or KTO's records
  const int64_t units = o.trl.kto ? kto_records(*set) : pairs ? set->size() / 2 : set->size();
  if (eval_only) {  // every sample is scored
    split.val.resize(static_cast<size_t>(units));
    std::iota(split.val.begin(), split.val.end(), int64_t{0});
  } else {
    split = split_samples(units, c.data.val_fraction);
  }
  if (!eval_only && split.train.empty())
    throw RuntimeError("'" + c.data.path + "' leaves no training sample after the validation split");
  if (o.trl.kto) return kto_examples(c, tok, format, o, set, split, how);
  if (pairs) return preference_pairs(c, tok, format, o, set, std::move(split), how);
  auto rows =
      std::make_unique<SampleRows>(set, split, c.data.seq_len, static_cast<uint64_t>(c.run.seed), c.data.packing);
  RunData d;
  const auto n = [](int64_t v) { return log::grouped(static_cast<double>(v)); };
  d.report.push_back("data: " + c.data.path + ": " + n(st.records) + " records (" + n(st.text) + " text, " +
                     n(st.chat) + " chat, " + n(st.prompt_completion) + " prompt/completion) tokenized with " +
                     tok.path() +
                     (st.chat ? ", chats as " + chat_template_names()[static_cast<size_t>(format.kind)] +
                                    " renders them (" + format.source + ")"
                              : std::string()) +
                     (st.text || st.prompt_completion
                          ? ", text as TRL's SFTTrainer tokenizes it (ending with eos_token " + o.trl.eos + ")"
                          : std::string()) +
                     ", " + how);
  d.report.push_back(
      "samples: " + n(set->size()) + " (train " + n(static_cast<int64_t>(split.train.size())) + ", validation " +
      n(static_cast<int64_t>(split.val.size())) + ") | " + n(set->total_ids()) + " tokens | trained on " +
      n(set->total_trained()) + " = " +
      percent(static_cast<double>(set->total_trained()) / static_cast<double>(set->total_ids() - set->size())) +
      " of the predicted tokens" + (c.data.train_on_prompt ? " (train_on_prompt)" : " (replies / completions)"));
  d.report.push_back(
      "longer than seq_len+1 = " + std::to_string(o.max_ids) + " tokens: " + n(st.truncated) + " truncated, " +
      n(st.dropped_too_long) + " dropped | nothing to train: " + n(st.dropped_untrained) + " dropped" +
      (st.reasoning_dropped ? " | replies whose reasoning the template leaves out: " + n(st.reasoning_dropped)
                            : std::string()) +
      (st.call_text_dropped
           ? " | replies whose text beside a tool call the template leaves out: " + n(st.call_text_dropped)
           : std::string()) +
      record_notes(st));
  const int64_t T = c.data.seq_len;
  const RowFill tf = rows->train_fill(), vf = rows->val_fill();
  d.report.push_back(std::string(c.data.packing ? "packing" : "padding (one sample per row)") + ": " + n(tf.rows) +
                     " training rows of " + std::to_string(T) + " per epoch, " + percent(tf.fraction(T)) +
                     " filled | " + n(vf.rows) + " validation rows, " + percent(vf.fraction(T)) + " filled");
  d.rows = std::move(rows);
  return d;
}

}  // namespace

RunData open_data(const Config& c, Collectives* comm, const c10::Device& device, bool eval_only) {
  try {
    return holds_records(c.data.format) ? jsonl_samples(c, comm, device, eval_only) : token_stream(c, eval_only);
  } catch (const RuntimeError& e) {
    const char* key = dynamic_cast<const CacheWriteError*>(&e) ? "data.cache_dir" : "data.path";
    const Config::Origin o = c.origin(key);
    throw ConfigError({{o.file, o.line, key, e.what()}});
  }
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const FsdpModel& model, std::vector<OptimTarget> targets) {
  const auto& o = c.optimizer;
  const bool sr = model.policy().stochastic_rounding;
  const auto seed = static_cast<uint64_t>(c.run.seed);
  if (o.name == OptimizerName::adamw8bit) {
    std::vector<Blocking> blocking;
    for (const auto& u : model.trained_units())
      blocking.push_back(Blocking::of(u.layout, u.shard_offset, u.shard_numel, kMin8bitNumel));
    return std::make_unique<AdamW8bit>(
        std::move(targets), std::move(blocking),
        AdamW8bitOptions{{o.betas[0], o.betas[1], o.eps, o.weight_decay, sr, seed}, kMin8bitNumel});
  }
  return std::make_unique<AdamW>(
      std::move(targets), AdamWOptions{o.betas[0], o.betas[1], o.eps, o.weight_decay, sr, seed, model.policy().kahan});
}

std::vector<OptimTarget> optim_targets(FsdpModel& model) {
  std::vector<OptimTarget> targets;
  for (size_t i = 0; i < model.trained_units().size(); ++i) {
    auto& u = model.trained_units()[i];
    targets.push_back({u.layout.name, u.shard,
                       std::clamp<int64_t>(u.layout.decay_numel - u.shard_offset, 0, u.shard_numel),
                       (static_cast<uint64_t>(i) << 40) + static_cast<uint64_t>(u.shard_offset)});
  }
  return targets;
}

}  // namespace ptrain
