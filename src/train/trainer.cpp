#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <nlohmann/json.hpp>
#include <optional>

#include "checkpoint/checkpoint.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "data/rows.h"
#include "optim/lr_schedule.h"
#include "optim/optimizer.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "parallel/precision.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"
#include "train/decode.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/preference.h"
#include "train/profile.h"
#include "train/setup.h"
#include "train/step.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ptrain {

namespace fs = std::filesystem;

namespace {

// A logged step's or evaluation's preference metrics, in brief: DPO's margin and accuracy, KTO's
// KL term and rewards (TRL's names).
std::string preference_note(const PreferenceMetrics& m) {
  if (!m.kto) return " | margin " + log::fixed(m.margins, 4) + " | accuracy " + log::fixed(m.accuracies, 3);
  std::string out;
  for (const auto& [name, value] : m.more)
    if (name == "kl" || name == "rewards/chosen" || name == "rewards/rejected")
      out += " | " + name + " " + log::fixed(value, 4);
  return out;
}
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

// SIGINT / SIGTERM ask the run to stop after the current step; the previous handlers come
// back when the run ends, however it ends.
class StopSignals {
 public:
  StopSignals() : int_(std::signal(SIGINT, on_stop_signal)), term_(std::signal(SIGTERM, on_stop_signal)) {
    g_stop_signal = 0;
  }
  ~StopSignals() {
    std::signal(SIGINT, int_);
    std::signal(SIGTERM, term_);
  }
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

 private:
  void (*int_)(int);
  void (*term_)(int);
};

double now_s() { return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count(); }

// Wall-clock step times need the GPU's queued work finished.
void sync(const c10::Device& device) {
#ifdef PTRAIN_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

// One step as every rank agrees on it.
struct StepRecord {
  StepResult result;  // this rank's loss, the global gradient norm
  double loss = 0.0;  // mean over the step's trained tokens, all ranks
  double lr = 0.0;
  double seconds = 0.0;
  CommStats comm;     // this step's collectives
  bool stop = false;  // some rank was asked to stop
};

// Everything a run holds between steps. The constructor is the setup: device, collectives,
// model, optimizer, resume, data, metrics file.
bool every(int64_t step, int64_t n) { return n > 0 && step % n == 0; }
// Whether training logs step `step` (1-based) to metrics.jsonl and the console.
bool logged(const Config& c, int64_t step) {
  return every(step, c.training.log_every) || step == 1 || step == c.training.steps;
}

class Run {
 public:
  explicit Run(const Config& c)
      : c_(c),
        env_(DistEnv::detect()),
        device_(resolve_device(c, env_)),
        comm_(connect(c, env_, device_)),
        rank_(comm_->rank()),
        ws_(comm_->world_size()),
        out_dir_(c.output_dir()),
        schedule_{c.optimizer.lr, c.training.steps, c.lr_schedule},
        data_(open_data(c, comm_.get(), device_)),
        profiler_(c, rank_, device_.is_cuda(), out_dir_) {
    for (const auto& line : data_.report) log::info(line);
    if (!c.training.sample_prompts.empty()) prepare_samples();
    if (rank_ == 0) {
      fs::create_directories(out_dir_);
      write_file_atomic(out_dir_ + "/config.resolved.toml", to_toml(c));
    }
    const bool ref_model = has_reference(c.training.objective) && !c.preference.ref_model.empty();
    if (ref_model)  // another model as DPO's reference: scored and freed before the policy is built
      reference_logps_ = score_ref_model(c, device_, comm_, dynamic_cast<const PairedRows&>(*data_.rows));
    model_ = build_model(c, device_, comm_);
    // before a resume replaces it: DPO's reference keeps lora.adapter_path's adapter as loaded
    reference_adapter_ = reference_adapter(*model_, c.training.objective, !c.lora.adapter_path.empty() && !ref_model);
    pairs_ = is_preference(c.training.objective);
    preference_ = {c.training.objective, c.preference, reference_adapter_.empty() ? nullptr : &reference_adapter_};
    if (ref_model) preference_.reference_logps = &reference_logps_;
    if (has_reference(c.training.objective) && c.preference.precompute_ref_log_probs && !ref_model) {
      const double t0 = now_s();  // the reference is the model as loaded: before a resume replaces it
      reference_logps_ = precompute_reference(*model_, dynamic_cast<const PairedRows&>(*data_.rows),
                                              c.data.micro_batch_size, c.memory.loss_chunk_tokens, preference_);
      preference_.reference_logps = &reference_logps_;
      log::info("reference log-probabilities of ", reference_logps_.size(0), " pairs precomputed in ",
                log::fixed(now_s() - t0, 2), " s (preference.precompute_ref_log_probs)");
    }
    optim_ = make_optimizer(c, *model_, optim_targets(*model_));
    optim_->count_lost_updates(c.training.count_lost_updates);
    if (rank_ == 0) recover_checkpoint_dir(c.checkpoint_dir());  // a crashed run's leftovers
    comm_->barrier();
    std::string resume = c.checkpoint.resume;
    if (resume == "auto")
      resume = resume_latest(c.checkpoint_dir(), *model_, optim_.get(), progress);  // the newest that verifies
    else if (!resume.empty())
      load_checkpoint(resume, *model_, optim_.get(), progress);
    if (!resume.empty()) {
      log::info("resumed from ", resume, " at step ", progress.step, " (", progress.samples, " rows consumed)");
      if (!progress.data.empty() && progress.data != data_.rows->fingerprint())
        log::warn("the data differs from the checkpoint's (", progress.data, " then, ", data_.rows->fingerprint(),
                  " now: another file, or a changed data.seq_len / data.packing / data.val_fraction / tokenizer); "
                  "training goes on from row ",
                  progress.samples, " of these rows, so it is not an exact continuation");
    } else if (c.checkpoint.resume == "auto") {
      log::info("no checkpoint in ", c.checkpoint_dir(), "; starting fresh");
    }
    progress.data = data_.rows->fingerprint();
    if (rank_ == 0) metrics_ = std::make_unique<MetricsWriter>(out_dir_ + "/metrics.jsonl", progress.step > 0);
    const int64_t T = c.data.seq_len, B = c.data.micro_batch_size;
    // global; a preference micro-batch holds B pairs, 2B rows
    tokens_per_step_ = B * T * c.training.grad_accum_steps * ws_ * (pairs_ ? 2 : 1);
    flops_per_token_ =
        6.0 * model_->shape().flops_params() + 12.0 * model_->shape().n_layers * model_->shape().q_dim() * T;
    log::info("ptrain ", PTRAIN_VERSION, " | model ", model_->shape().describe(), ", ",
              log::grouped(model_->plan().num_params()), " params | ", name_of(c.precision.mode), " on ", device_.str(),
              " x ", ws_, " rank(s) (", comm_->name(), ") | ", at::get_num_threads(), " threads/rank | global batch ",
              B, "x", T, " x", c.training.grad_accum_steps, " accum x", ws_, " ranks = ", tokens_per_step_,
              " tokens/step | ", data_.rows->train_fill().rows, " rows/epoch");
    if (model_->policy().logits_dtype != at::kFloat)
      log::warn(
          "precision.logits_dtype = \"bfloat16\": logits are rounded to bfloat16 before the loss; this saves at most "
          "one loss chunk of memory and costs loss accuracy (float32 is the default)");
  }

  TrainProgress progress;

  // One optimizer step (the common one, or optimizer-in-backward's), then the ranks agree on
  // the mean loss and on stopping; memory.json is written after the first.
  StepRecord step() {
    StepRecord s;
    profiler_.before_step(progress.step + 1);
    const double t0 = now_s();
    comm_->stats.reset();
    s.lr = schedule_.lr(progress.step);
    const int64_t B = c_.data.micro_batch_size;
    // Global row order: micro-batch a of rank r takes rows (a*ws + r)*B ... of this step.
    auto micro_batch = [&](int64_t a) {
      return data_.rows->train_rows(progress.samples + static_cast<uint64_t>((a * ws_ + rank_) * B), B).to(device_);
    };
    // SFT measures TRL's token metrics on the steps it logs (they cost a pass over the logits).
    const bool token_metrics = !pairs_ && c_.training.token_metrics && logged(c_, progress.step + 1);
    const StepOptions options{c_.training.grad_accum_steps,    c_.training.max_grad_norm,
                              c_.memory.loss_chunk_tokens,     c_.kernels.fused_grad_norm,
                              pairs_ ? &preference_ : nullptr, token_metrics};
    s.result = c_.optimizer.in_backward ? train_step_in_backward(*model_, *optim_, micro_batch, s.lr, options)
                                        : train_step(*model_, *optim_, micro_batch, s.lr, options);
    progress.samples += static_cast<uint64_t>(B * c_.training.grad_accum_steps * ws_);
    progress.num_tokens += static_cast<uint64_t>(pairs_ ? s.result.preference.num_tokens : s.result.num_tokens);
    ++progress.step;
    at::Tensor agree = at::tensor({g_stop_signal.load() ? 1.0 : 0.0}, at::kDouble);
    comm_->all_reduce_sum(agree);
    sync(device_);
    s.seconds = now_s() - t0;
    if (const std::string trace = profiler_.after_step(progress.step); !trace.empty())
      log::info("profile of steps ", c_.training.profile_start, "-", progress.step, " written: ", trace);
    s.comm = comm_->stats;
    s.loss = s.result.loss;  // the step's mean over all ranks' trained tokens
    s.stop = agree[0].item<double>() > 0;
    if (!std::isfinite(s.loss))
      throw RuntimeError("loss became " + std::to_string(s.loss) + " at step " + std::to_string(progress.step) +
                         "; lower optimizer.lr or check the data");
    if (!memory_written_) {  // after this process's first step: grads and optimizer state exist
      if (rank_ == 0) write_file_atomic(out_dir_ + "/memory.json", measure_memory(*model_, *optim_).to_json() + "\n");
      memory_written_ = true;
    }
    return s;
  }

  void log_step(const StepRecord& s) {
    const PeakMemory peak = peak_memory(device_);
    const double tps = static_cast<double>(tokens_per_step_) / s.seconds;
    // Offloading: the most host bytes the offloaded block inputs have held (tensor bytes).
    const int64_t offloaded = model_->offloader() ? model_->offloader()->peak_host_bytes() : 0;
    std::vector<MetricsWriter::Field> row{{"step", progress.step},
                                          {"loss", s.loss},
                                          {"lr", s.lr},
                                          {"grad_norm", s.result.grad_norm},
                                          {"tokens_per_s", tps},
                                          {"step_time_s", s.seconds},
                                          {"tflops", tps * flops_per_token_ / 1e12},
                                          {"peak_mem_bytes", peak.bytes},
                                          {"peak_mem_source", peak.source},
                                          {"world_size", static_cast<int64_t>(ws_)},
                                          {"tokens_seen", static_cast<int64_t>(progress.samples) * c_.data.seq_len},
                                          {"trained_tokens", s.result.trained_tokens},
                                          {"comm_all_gather_bytes", s.comm.all_gather_bytes},
                                          {"comm_reduce_scatter_bytes", s.comm.reduce_scatter_bytes},
                                          {"comm_all_reduce_bytes", s.comm.all_reduce_bytes},
                                          {"offload_host_peak_bytes", offloaded}};
    // On CUDA, the allocator's peak in each phase of this step, beside `ptrain check`'s "by phase".
    const PhasePeaks& phases = s.result.peaks;
    if (phases.forward >= 0) row.push_back({"peak_forward_bytes", phases.forward});
    if (phases.backward >= 0) row.push_back({"peak_backward_bytes", phases.backward});
    if (phases.optimizer >= 0) row.push_back({"peak_optimizer_bytes", phases.optimizer});
    if (phases.forward_start >= 0) row.push_back({"allocated_forward_start_bytes", phases.forward_start});
    if (phases.backward_start >= 0) row.push_back({"allocated_backward_start_bytes", phases.backward_start});
    std::string pair_note;
    if (!pairs_) {  // SFTTrainer's: token means over the step's trained tokens, the running count of ids
      if (!std::isnan(s.result.entropy)) {
        row.push_back({"entropy", s.result.entropy});
        row.push_back({"mean_token_accuracy", s.result.mean_token_accuracy});
      }
      row.push_back({"num_tokens", static_cast<int64_t>(progress.num_tokens)});
    }
    if (pairs_) {  // TRL's names
      const PreferenceMetrics& m = s.result.preference;
      for (const auto& [name, value] : trl_metrics(m, "")) row.push_back({name, value});
      row.push_back({m.kto ? "examples" : "pairs", m.pairs});
      // DPOTrainer's and KTOTrainer's running count of the ids trained on (CPO's and ORPO's log none)
      if (c_.training.objective == Objective::dpo || c_.training.objective == Objective::kto)
        row.push_back({"num_tokens", static_cast<int64_t>(progress.num_tokens)});
      pair_note = preference_note(m);
    }
    std::string lost_note;
    if (c_.training.count_lost_updates) {  // since the last logged step, every rank's elements
      const UpdateCounts own = optim_->take_update_counts();
      at::Tensor counts = at::tensor({static_cast<double>(own.computed), static_cast<double>(own.lost)}, at::kDouble);
      comm_->all_reduce_sum(counts);
      const auto computed = static_cast<int64_t>(counts[0].item<double>());
      const auto lost = static_cast<int64_t>(counts[1].item<double>());
      row.push_back({"updates_computed", computed});
      row.push_back({"updates_lost", lost});
      lost_note =
          " | lost updates " + log::fixed(computed ? 100.0 * static_cast<double>(lost) / computed : 0.0, 2) + " %";
    }
    if (metrics_) metrics_->write(row);
    log::info("step ", progress.step, "/", c_.training.steps, " | loss ", log::fixed(s.loss, 4), pair_note, " | lr ",
              log::sci(s.lr, 2), " | grad_norm ", log::fixed(s.result.grad_norm, 3), " | ", log::grouped(tps),
              " tok/s | ", log::fixed(s.seconds, 3), " s/step | peak ",
              peak.source == "process_peak_rss" ? "RSS " : "allocated ", log::bytes(peak.bytes),
              ws_ > 1 ? " (rank 0)" : "", lost_note);
  }

  // The sample prompts' ids (plain, or a user turn of the chat template); a tokenizer or template
  // that cannot render them is a config problem, before training starts.
  void prepare_samples() {
    try {
      sample_tok_ = std::make_unique<Tokenizer>(c_.tokenizer_path());
      std::optional<ChatFormat> format;
      if (c_.training.sample_chat) format = chat_format(*sample_tok_, c_.data.chat_template);
      for (const auto& p : c_.training.sample_prompts)
        samples_.push_back(format ? render_prompt(*sample_tok_, *format, {{"user", p}})
                                  : sample_tok_->encode_with_special_tokens(p));
      sample_eos_ = eos_ids(c_, sample_tok_.get(), format ? &*format : nullptr);
    } catch (const RuntimeError& e) {
      const Config::Origin o = c_.origin("training.sample_prompts");
      throw ConfigError({{o.file, o.line, "training.sample_prompts", e.what()}});
    }
  }

  // training.sample_prompts, completed greedily by every rank in step (the same tokens on each:
  // every rank computes the same logits), logged by rank 0.
  void sample() {
    if (samples_.empty()) return;
    SamplingOptions o;
    o.max_new_tokens = c_.training.sample_tokens;
    for (size_t i = 0; i < samples_.size(); ++i) {
      const Completion done = complete(*model_, samples_[i], sample_eos_, o, sample_tok_.get());
      log::info("sample step ", progress.step, " | ", c_.training.sample_prompts[i], " -> ",
                nlohmann::json(done.text).dump(), " (", done.ids.size(), " tokens, ", done.finish, ")");
      if (metrics_)
        metrics_->write({{"step", progress.step},
                         {"sample", static_cast<int64_t>(i)},
                         {"prompt", c_.training.sample_prompts[i]},
                         {"text", done.text}});
    }
  }

  void eval() {
    sample();
    const int64_t B = c_.data.micro_batch_size;
    if (data_.rows->val_rows() == 0) return;
    if (pairs_) {
      const PreferenceMetrics m = evaluate_preference(*model_, *data_.rows, B, c_.memory.loss_chunk_tokens, preference_,
                                                      c_.training.eval_batches * B);
      if (metrics_) {
        std::vector<MetricsWriter::Field> row{{"step", progress.step}, {"eval_loss", m.loss}};
        for (const auto& [name, value] : trl_metrics(m, "eval_")) row.push_back({name, value});
        row.push_back({m.kto ? "eval_examples" : "eval_pairs", m.pairs});
        metrics_->write(row);
      }
      log::info("eval  step ", progress.step, " | eval_loss ", log::fixed(m.loss, 4), preference_note(m), " | ",
                m.pairs, m.kto ? " examples" : " pairs");
      return;
    }
    const bool token_metrics = c_.training.token_metrics;
    EvalResult e =
        evaluate(*model_, *data_.rows, B, c_.memory.loss_chunk_tokens, c_.training.eval_batches * B, token_metrics);
    std::vector<MetricsWriter::Field> row{
        {"step", progress.step}, {"val_loss", e.mean_loss}, {"val_ppl", e.perplexity}, {"val_tokens", e.tokens}};
    std::string note;
    if (token_metrics && e.tokens) {
      row.push_back({"val_entropy", e.entropy});
      row.push_back({"val_mean_token_accuracy", e.mean_token_accuracy});
      note = " | entropy " + log::fixed(e.entropy, 4) + " | token accuracy " + log::fixed(e.mean_token_accuracy, 4);
    }
    if (metrics_) metrics_->write(row);
    log::info("eval  step ", progress.step, " | val_loss ", log::fixed(e.mean_loss, 4), " | val_ppl ",
              log::fixed(e.perplexity, 2), note, " | ", e.tokens, " tokens");
  }

  void checkpoint() {
    if (last_checkpoint_step_ == progress.step) return;  // already written
    last_checkpoint_ =
        save_checkpoint(c_.checkpoint_dir(), *model_, *optim_, progress, c_.checkpoint.keep, to_toml(c_));
    last_checkpoint_step_ = progress.step;
    log::info("checkpoint written: ", last_checkpoint_);
  }

  // A stop signal: the step is done; keep it in a checkpoint and exit 130.
  int stop() {
    log::warn("stop signal received: stopping after step ", progress.step);
    checkpoint();
    log::info("resume with --set checkpoint.resume=auto");
    return 130;
  }

  int done() {
    if (c_.checkpoint.save_final) checkpoint();
    log::info("done. outputs in ", out_dir_, "/: metrics.jsonl, memory.json, config.resolved.toml",
              last_checkpoint_.empty() ? "" : ", " + fs::relative(last_checkpoint_, out_dir_).string());
    return 0;
  }

 private:
  const Config& c_;
  DistEnv env_;
  c10::Device device_;
  std::shared_ptr<Collectives> comm_;
  int rank_ = 0, ws_ = 1;
  std::string out_dir_;
  LrSchedule schedule_;
  RunData data_;
  StepProfiler profiler_;
  std::unique_ptr<FsdpModel> model_;
  std::unique_ptr<Optimizer> optim_;
  std::unique_ptr<MetricsWriter> metrics_;
  std::unique_ptr<Tokenizer> sample_tok_;      // training.sample_prompts: their tokenizer,
  std::vector<std::vector<int32_t>> samples_;  // their ids,
  std::vector<int32_t> sample_eos_;            // and where they stop
  bool pairs_ = false;                         // a preference objective: rows are pairs
  PreferenceObjective preference_;             // its objective and [preference] options
  std::vector<at::Tensor> reference_adapter_;  // DPO from lora.adapter_path: this rank's shards of it
  at::Tensor reference_logps_;                 // DPO, precompute_ref_log_probs: [pairs, 2]
  int64_t tokens_per_step_ = 0;
  double flops_per_token_ = 0.0;
  std::string last_checkpoint_;
  int64_t last_checkpoint_step_ = -1;
  bool memory_written_ = false;
};

}  // namespace

int train(const Config& c) {
  Run run(c);  // device, collectives, model, optimizer, resume, data, metrics
  StopSignals signals;
  while (run.progress.step < c.training.steps) {
    const StepRecord s = run.step();
    const int64_t step = run.progress.step;
    const bool last = step == c.training.steps;
    if (logged(c, step)) run.log_step(s);
    if (c.training.eval_every > 0 && (every(step, c.training.eval_every) || last)) run.eval();
    if (every(step, c.checkpoint.every_steps)) run.checkpoint();
    if (s.stop && !last) return run.stop();
  }
  return run.done();
}

EvalResult evaluate(FsdpModel& model, const RowSource& data, int64_t batch, int64_t loss_chunk, int64_t max_rows,
                    bool token_metrics) {
  int64_t n = data.val_rows();
  if (max_rows >= 0) n = std::min(n, max_rows);
  EvalResult r;
  LossSum total;
  for (int64_t first = 0; first < n; first += batch) {
    const Batch b = data.val_batch(first, std::min(batch, n - first)).to(model.device());
    const LossSum s = model.eval_loss(b.inputs, b.targets, loss_chunk, b.doc_ids, token_metrics);
    total.sum += s.sum;
    total.tokens += s.tokens;
    total.entropy_sum += s.entropy_sum;
    total.top1 += s.top1;
  }
  r.rows = n;
  r.tokens = total.tokens;
  const auto tokens = static_cast<double>(std::max<int64_t>(total.tokens, 1));
  r.mean_loss = total.tokens ? total.sum / tokens : 0.0;
  r.perplexity = std::exp(r.mean_loss);
  if (token_metrics && total.tokens) {
    r.entropy = total.entropy_sum / tokens;
    r.mean_token_accuracy = total.top1 / tokens;
  }
  return r;
}

}  // namespace ptrain
