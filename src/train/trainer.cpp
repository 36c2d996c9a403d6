#include "train/trainer.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>
#include <torch/cuda.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <filesystem>
#include <thread>

#include "checkpoint/checkpoint.h"
#include "checkpoint/hf.h"
#include "checkpoint/peft.h"
#include "checkpoint/safetensors.h"
#include "common/alloc_meter.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "config/config.h"
#include "data/dataset.h"
#include "model/layout.h"
#include "model/llama.h"
#include "optim/adamw.h"
#include "optim/adamw8bit.h"
#include "optim/lr_schedule.h"
#include "parallel/collectives.h"
#include "parallel/dist.h"
#include "parallel/fsdp.h"
#include "quant/nf4.h"
#include "train/memory.h"
#include "train/metrics.h"
#include "train/step.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ptrain {

namespace fs = std::filesystem;

namespace {
std::atomic<int> g_stop_signal{0};
extern "C" void on_stop_signal(int sig) { g_stop_signal = sig; }

double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// Wall-clock step times need the GPU's queued work finished.
void sync(const c10::Device& device) {
#ifdef PTRAIN_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}
}  // namespace

c10::Device resolve_device(const Config& c, const DistEnv& env) {
  if (c.training.device == "cuda" || (c.training.device == "auto" && torch::cuda::is_available()))
    return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(env.local_rank));
  return c10::Device(c10::kCPU);
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

std::unique_ptr<FsdpModel> build_model(const Config& c, const c10::Device& device, std::shared_ptr<Collectives> comm) {
  FsdpOptions o;
  o.reshard_after_forward = c.parallel.reshard_after_forward;
  o.activation_checkpointing = c.memory.activation_checkpointing == "full";
  o.activation_offloading = c.memory.activation_offloading;
  o.prefetch = c.parallel.prefetch;
  o.lora = c.lora.enabled;
  o.lora_targets = c.lora.targets;
  o.lora_rank = c.lora.rank;
  o.lora_alpha = c.lora.alpha;
  o.lora_dropout = c.lora.dropout;
  o.nf4_base = c.quant.base == "nf4";
  o.double_quant = c.quant.double_quant;
  auto model = std::make_unique<FsdpModel>(c.model.shape, precision_policy(c), device, c.model.init_std,
                                           std::move(comm), o);
  if (!c.model.hf_path.empty()) {
    {
      MeterScope scope;  // host allocations during the load: the full-precision model must never be among them
      model->load(HfCheckpoint(c.model.hf_path).by_name());
      if (model->lora())
        log::info("loaded ", c.model.hf_path, (c.quant.base == "nf4" ? " (NF4, one matrix group at a time)" : ""),
                  ": peak host allocation during the load ", log::bytes(static_cast<double>(scope.meter().peak.load())),
                  " (the checkpoint's full-precision weights: ", log::bytes(4.0 * static_cast<double>(model->num_params())),
                  " in float32)");
    }
    model->init_adapters(static_cast<uint64_t>(c.run.seed));
  } else {
    model->init_weights(static_cast<uint64_t>(c.run.seed));
  }
  if (!c.lora.adapter_path.empty()) model->load_adapters(read_peft(c.lora.adapter_path).tensors);
  return model;
}

std::unique_ptr<Optimizer> make_optimizer(const Config& c, const FsdpModel& model, std::vector<OptimTarget> targets) {
  const auto& o = c.optimizer;
  const bool sr = model.policy().stochastic_rounding;
  const auto seed = static_cast<uint64_t>(c.run.seed);
  if (o.name == "adamw8bit") {
    std::vector<Blocking> blocking;
    for (const auto& u : model.trainable_units())
      blocking.push_back(Blocking::of(u.layout, u.shard_offset, u.shard_numel, kMin8bitNumel));
    return std::make_unique<AdamW8bit>(std::move(targets), std::move(blocking),
                                       AdamW8bitOptions{{o.betas[0], o.betas[1], o.eps, o.weight_decay, sr, seed}, kMin8bitNumel});
  }
  return std::make_unique<AdamW>(std::move(targets), AdamWOptions{o.betas[0], o.betas[1], o.eps, o.weight_decay, sr, seed});
}

std::vector<OptimTarget> optim_targets(FsdpModel& model) {
  std::vector<OptimTarget> targets;
  for (size_t i = 0; i < model.trainable_units().size(); ++i) {
    auto& u = model.trainable_units()[i];
    targets.push_back({u.layout.name, u.shard, std::clamp<int64_t>(u.layout.decay_numel - u.shard_offset, 0, u.shard_numel),
                       (static_cast<uint64_t>(i) << 40) + static_cast<uint64_t>(u.shard_offset)});
  }
  return targets;
}

void export_merged(const std::string& checkpoint_dir, const std::string& out_dir) {
  Environment env = Environment::detect();
  env.local = false;  // the training run's data files need not be here
  Config c = load_config((fs::path(checkpoint_dir) / "config.toml").string(), {}, env);
  if (!c.lora.enabled) throw UsageError("--merge needs a LoRA checkpoint; '" + checkpoint_dir + "' holds a full model (drop --merge)");
  c.training.device = "cpu";
  c.checkpoint.resume.clear();
  // Read the frozen base at its source's full precision (a bf16 run keeps it in bf16); the
  // adapters convert exactly.
  c.precision.mode = "fp32";
  auto model = build_model(c, c10::Device(c10::kCPU), make_collectives(DistEnv{}, "auto", c10::Device(c10::kCPU), 60.0));
  TrainProgress progress;
  load_checkpoint(checkpoint_dir, *model, nullptr, progress);
  at::NoGradGuard no_grad;
  const LlamaShape& s = c.model.shape;
  const auto full = llama_units(s, c.model.init_std);
  const double scale = c.lora.alpha / static_cast<double>(c.lora.rank);
  std::vector<std::pair<std::string, at::Tensor>> named;
  for (size_t i = 0; i < full.size(); ++i) {
    const FlatUnit& u = model->units()[i];
    at::Tensor flat = at::zeros({full[i].numel}, at::kFloat);
    // The base: dense units copy over by slot; NF4 groups are dequantized into place.
    for (const auto& slot : u.layout.slots)
      flat.narrow(0, full[i].offset_of(slot.name), slot.numel).copy_(u.shard.narrow(0, slot.offset, slot.numel));
    if (c.quant.base == "nf4" && full[i].kind == UnitKind::block) {
      const auto groups = block_matrix_groups(full[i]);
      for (int g = 0; g < 4; ++g) {
        at::Tensor w = nf4::dequantize(*model->nf4_weight(i, g), at::kFloat).reshape({-1});
        flat.narrow(0, groups[static_cast<size_t>(g)].front().offset, w.numel()).copy_(w);
      }
    }
    const FlatUnit& a = model->trainable_units()[i];
    for (const auto& slot : a.layout.slots) {  // W += scale * B @ A, per adapted projection
      const auto lora_at = slot.name.find(".lora_A.weight");
      if (lora_at == std::string::npos) continue;
      const std::string stem = slot.name.substr(0, lora_at);
      const std::string b_name = stem + ".lora_B.weight";
      const auto& b_slot = *std::find_if(a.layout.slots.begin(), a.layout.slots.end(), [&](const ParamSlot& x) { return x.name == b_name; });
      at::Tensor A = slot_view(a.shard, slot).to(at::kFloat);
      at::Tensor B = slot_view(a.shard, b_slot).to(at::kFloat);
      const std::string w_name = stem + ".weight";
      const int64_t off = full[i].offset_of(w_name);
      flat.narrow(0, off, B.size(0) * A.size(1)).view({B.size(0), A.size(1)}).add_(at::mm(B, A), scale);
    }
    for (const auto& slot : full[i].slots) named.emplace_back(slot.name, slot_view(flat, slot));
  }
  fs::create_directories(out_dir);
  write_safetensors((fs::path(out_dir) / "model.safetensors").string(), named, {{"format", "pt"}});
  write_hf_config(out_dir, s);
}

EvalResult evaluate(FsdpModel& model, const TokenData& data, int64_t begin, int64_t end, int64_t seq_len, int64_t batch,
                    int64_t loss_chunk, int64_t max_windows) {
  const int64_t stride = seq_len + 1;
  int64_t n = (end - begin) / stride;
  if (max_windows >= 0) n = std::min(n, max_windows);
  EvalResult r;
  double sum = 0.0;
  for (int64_t first = 0; first < n; first += batch) {
    std::vector<int64_t> starts;
    for (int64_t w = first; w < std::min(n, first + batch); ++w) starts.push_back(begin + w * stride);
    at::Tensor win = windows_at(data, starts, stride).to(model.device());
    LossSum s = model.eval_loss(win.narrow(1, 0, seq_len), win.narrow(1, 1, seq_len), loss_chunk);
    sum += s.sum;
    r.tokens += s.tokens;
  }
  r.windows = n;
  r.mean_loss = r.tokens ? sum / static_cast<double>(r.tokens) : 0.0;
  r.perplexity = std::exp(r.mean_loss);
  return r;
}

int train(const Config& c) {
  const DistEnv env = DistEnv::detect();
  const c10::Device device = resolve_device(c, env);
  std::shared_ptr<Collectives> comm = connect(c, env, device);
  const int rank = comm->rank(), ws = comm->world_size();
  const std::string out_dir = c.output_dir();
  if (rank == 0) {
    fs::create_directories(out_dir);
    write_file_atomic(out_dir + "/config.resolved.toml", to_toml(c));
  }

  auto model = build_model(c, device, comm);
  std::unique_ptr<Optimizer> optimizer = make_optimizer(c, *model, optim_targets(*model));
  Optimizer& optim = *optimizer;
  const LrSchedule schedule{c.optimizer.lr, c.lr_schedule.warmup_steps, c.training.steps, c.lr_schedule.decay,
                            c.lr_schedule.min_lr_ratio};

  TrainProgress progress;
  std::string resume = c.checkpoint.resume == "auto" ? latest_checkpoint(c.checkpoint_dir()) : c.checkpoint.resume;
  if (!resume.empty()) {
    load_checkpoint(resume, *model, &optim, progress);
    log::info("resumed from ", resume, " at step ", progress.step, " (", progress.samples, " samples consumed)");
  } else if (c.checkpoint.resume == "auto") {
    log::info("no checkpoint in ", c.checkpoint_dir(), "; starting fresh");
  }

  TokenData data(c.data.path, c.data.format);
  const int64_t T = c.data.seq_len, B = c.data.micro_batch_size, accum = c.training.grad_accum_steps;
  const Split train_part = train_split(data, c.data.val_fraction, T);
  const Split val_part = val_split(data, c.data.val_fraction, T);
  WindowSampler sampler(train_part, T, static_cast<uint64_t>(c.run.seed));
  std::unique_ptr<MetricsWriter> metrics;
  if (rank == 0) metrics = std::make_unique<MetricsWriter>(out_dir + "/metrics.jsonl", progress.step > 0);
  const int64_t chunk = c.memory.loss_chunk_tokens;
  const int64_t tokens_per_step = B * T * accum * ws;  // global
  const double flops_per_token = 6.0 * model->shape().flops_params() +
                                 12.0 * model->shape().n_layers * model->shape().q_dim() * T;

  log::info("ptrain ", PTRAIN_VERSION, " | model ", log::grouped(model->num_params()), " params | ", c.precision.mode,
            " on ", device.str(), " x ", ws, " rank(s) (", comm->name(), ") | ", at::get_num_threads(),
            " threads/rank | global batch ", B, "x", T, " x", accum, " accum x", ws, " ranks = ", tokens_per_step,
            " tokens/step | ", sampler.windows_per_epoch(), " windows/epoch");

  if (model->policy().logits_dtype != at::kFloat)
    log::warn("precision.logits_dtype = \"bfloat16\": logits are rounded to bfloat16 before the loss; this saves at most "
              "one loss chunk of memory and costs loss accuracy (float32 is the default)");

  auto run_eval = [&](int64_t step) {
    if (val_part.size() <= T) return;
    EvalResult e = evaluate(*model, data, val_part.begin, val_part.end, T, B, chunk, c.training.eval_batches * B);
    if (metrics) metrics->write({{"step", step}, {"val_loss", e.mean_loss}, {"val_ppl", e.perplexity}, {"val_tokens", e.tokens}});
    log::info("eval  step ", step, " | val_loss ", log::fixed(e.mean_loss, 4), " | val_ppl ", log::fixed(e.perplexity, 2),
              " | ", e.tokens, " tokens");
  };
  std::string last_checkpoint;
  int64_t last_checkpoint_step = -1;
  auto checkpoint = [&] {
    last_checkpoint = save_checkpoint(c.checkpoint_dir(), *model, optim, progress, c.checkpoint.keep, to_toml(c));
    last_checkpoint_step = progress.step;
    log::info("checkpoint written: ", last_checkpoint);
  };

  const StepOptions step_options{accum, c.training.max_grad_norm, chunk};
  g_stop_signal = 0;
  auto old_int = std::signal(SIGINT, on_stop_signal);
  auto old_term = std::signal(SIGTERM, on_stop_signal);
  bool memory_written = false;
  while (progress.step < c.training.steps) {
    const double t0 = now_s();
    comm->stats.reset();
    const double lr = schedule.lr(progress.step);
    // Global sample order: micro-batch a of rank r takes samples (a*ws + r)*B ... of this step.
    auto micro_batch = [&](int64_t a) {
      return sample_batch(data, sampler, progress.samples + static_cast<uint64_t>((a * ws + rank) * B), B, T).to(device);
    };
    const StepResult r = c.optimizer.in_backward ? train_step_in_backward(*model, optim, micro_batch, lr, step_options)
                                                 : train_step(*model, optim, micro_batch, lr, step_options);
    progress.samples += static_cast<uint64_t>(B * accum * ws);
    ++progress.step;
    // Mean loss over ranks, and whether any rank was asked to stop (all stop together).
    at::Tensor agree = at::tensor({r.loss, g_stop_signal.load() ? 1.0 : 0.0}, at::kDouble);
    comm->all_reduce_sum(agree);
    sync(device);
    const double dt = now_s() - t0;
    const CommStats step_comm = comm->stats;
    const double loss = agree[0].item<double>() / ws;
    const bool stop = agree[1].item<double>() > 0;
    if (!std::isfinite(loss))
      throw RuntimeError("loss became " + std::to_string(loss) + " at step " + std::to_string(progress.step) +
                         "; lower optimizer.lr or check the data");
    if (!memory_written) {  // after this process's first step: grads and optimizer state exist
      if (rank == 0) write_file_atomic(out_dir + "/memory.json", measure_memory(*model, optim).to_json() + "\n");
      memory_written = true;
    }
    const bool last = progress.step == c.training.steps;
    if (progress.step % c.training.log_every == 0 || progress.step == 1 || last) {
      const PeakMemory peak = peak_memory(device);
      const double tps = static_cast<double>(tokens_per_step) / dt;
      // Offloading: the most host bytes the offloaded block inputs have held (tensor bytes).
      const int64_t offloaded = model->offloader() ? model->offloader()->peak_host_bytes() : 0;
      if (metrics)
        metrics->write({{"step", progress.step},
                        {"loss", loss},
                        {"lr", lr},
                        {"grad_norm", r.grad_norm},
                        {"tokens_per_s", tps},
                        {"step_time_s", dt},
                        {"tflops", tps * flops_per_token / 1e12},
                        {"peak_mem_bytes", peak.bytes},
                        {"peak_mem_source", peak.source},
                        {"world_size", static_cast<int64_t>(ws)},
                        {"tokens_seen", static_cast<int64_t>(progress.samples) * T},
                        {"comm_all_gather_bytes", step_comm.all_gather_bytes},
                        {"comm_reduce_scatter_bytes", step_comm.reduce_scatter_bytes},
                        {"comm_all_reduce_bytes", step_comm.all_reduce_bytes},
                        {"offload_host_peak_bytes", offloaded}});
      log::info("step ", progress.step, "/", c.training.steps, " | loss ", log::fixed(loss, 4), " | lr ", log::sci(lr, 2),
                " | grad_norm ", log::fixed(r.grad_norm, 3), " | ", log::grouped(tps), " tok/s | ", log::fixed(dt, 3),
                " s/step | peak ", peak.source == "process_peak_rss" ? "RSS " : "allocated ", log::bytes(peak.bytes),
                ws > 1 ? " (rank 0)" : "");
    }
    if (c.training.eval_every > 0 && (progress.step % c.training.eval_every == 0 || last)) run_eval(progress.step);
    if (c.checkpoint.every_steps > 0 && progress.step % c.checkpoint.every_steps == 0) checkpoint();
    if (stop && !last) {
      log::warn("stop signal received: stopping after step ", progress.step);
      if (last_checkpoint_step != progress.step) checkpoint();
      log::info("resume with --set checkpoint.resume=auto");
      std::signal(SIGINT, old_int);
      std::signal(SIGTERM, old_term);
      return 130;
    }
  }
  std::signal(SIGINT, old_int);
  std::signal(SIGTERM, old_term);
  if (c.checkpoint.save_final && last_checkpoint_step != progress.step) checkpoint();
  log::info("done. outputs in ", out_dir, "/: metrics.jsonl, memory.json, config.resolved.toml",
            last_checkpoint.empty() ? "" : ", " + fs::relative(last_checkpoint, out_dir).string());
  return 0;
}

}  // namespace ptrain
