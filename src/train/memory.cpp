#include "train/memory.h"

#include <algorithm>
#include <fstream>
#include <optional>

#include <nlohmann/json.hpp>

#include "common/error.h"
#include "config/config.h"
#include "model/layout.h"
#include "model/loss.h"
#include "model/plan.h"
#include "model/shape.h"
#include "optim/adamw8bit.h"
#include "optim/optimizer.h"
#include "parallel/fsdp.h"
#include "parallel/precision.h"
#include "train/setup.h"

#ifdef PTRAIN_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace ptrain {

std::string MemoryReport::to_json() const {
  nlohmann::ordered_json j = {
      {"rank", rank},
      {"world_size", world_size},
      {"num_params", num_params},
      {"param_bytes", param_bytes},
      {"grad_bytes", grad_bytes},
      {"optimizer_state_bytes", optimizer_state_bytes},
      {"master_weight_bytes", master_weight_bytes},
      {"frozen_base_bytes", frozen_base_bytes},
      {"nf4_params", nf4_params},
      {"nf4_bytes", nf4_bytes},
      {"nf4_bytes_per_param", nf4_bytes_per_param()},
      {"total_state_bytes", total_state_bytes()},
      {"state_bytes_per_param", num_params ? static_cast<double>(total_state_bytes()) / num_params : 0.0}};
  return j.dump(2);
}

MemoryReport measure_memory(const FsdpModel& model, const Optimizer& optim) {
  MemoryReport r;
  r.rank = model.comm().rank();
  r.world_size = model.comm().world_size();
  for (const auto& u : model.trained_units()) {
    r.num_params += u.shard.numel();
    r.param_bytes += u.shard.nbytes();
    if (u.shard.grad().defined()) r.grad_bytes += u.shard.grad().nbytes();
  }
  if (model.lora().enabled)
    for (const auto& u : model.units(UnitRole::base)) r.frozen_base_bytes += u.shard.nbytes();
  r.nf4_params = model.plan().nf4_params();
  r.nf4_bytes = model.nf4_bytes();
  r.frozen_base_bytes += r.nf4_bytes;
  r.optimizer_state_bytes = optim.state_bytes();
  return r;
}

MemoryReport predict_memory(const Config& config, int world_size) {
  // The units the model will allocate (model/plan.h); every rank holds shard_numel() elements
  // of each (the last ones zero-padded).
  const ModelPlan plan = model_plan(config);
  auto shard_bytes = [&](const PlannedUnit& u) {
    return shard_numel(u.layout.numel, world_size) * c10::elementSize(u.stored);
  };
  MemoryReport r;
  r.world_size = world_size;
  for (const auto* units : {&plan.base, &plan.adapters, &plan.nf4})
    for (const auto& u : *units) {
      if (u.trained) {
        r.num_params += shard_numel(u.layout.numel, world_size);
        r.param_bytes += shard_bytes(u);
        r.grad_bytes += config.optimizer.in_backward ? 0 : shard_bytes(u);  // in-backward: never a full set
      } else {
        r.frozen_base_bytes += shard_bytes(u);
      }
      if (u.role == UnitRole::nf4) r.nf4_bytes += shard_bytes(u);
    }
  r.nf4_params = plan.nf4_params();
  const PrecisionPolicy policy = precision_policy(config);
  r.optimizer_state_bytes =
      (policy.kahan ? 3 : 2) * r.num_params * static_cast<int64_t>(c10::elementSize(policy.optim_dtype));
  if (config.optimizer.name ==
      OptimizerName::adamw8bit) {  // this rank's (rank 0's) blocks, as the optimizer lays them out
    r.optimizer_state_bytes = 0;
    for (const auto& u : plan.trained())
      r.optimizer_state_bytes +=
          Blocking::of(u.layout, 0, shard_numel(u.layout.numel, world_size), kMin8bitNumel).state_bytes();
  }
  return r;
}

ActivationEstimate predict_activations(const LlamaShape& s, const ActivationInputs& in) {
  const int64_t N = in.tokens, c = in.compute_bytes, d = s.dim, q = s.q_dim(), kv = s.kv_dim(), F = s.ffn_dim;
  const bool trained = !in.lora;  // the base's weights get gradients
  const auto& ad = in.adapted;
  enum { Q, K, V, O, GATE, UP, DOWN };
  // An RMSNorm keeps, per token: CUDA's fused kernel its input and a float32 rstd; the CPU's
  // composite one a float32 copy of its input (the input itself in fp32) and rstd, plus the
  // float32 normalized input when its weight is trained.
  const int64_t norm = in.fused_norm ? c * d + 4 : (trained ? 8 : 4) * d + 4;
  // A matmul keeps its input when its weight is trained or an adapter reads the same input.
  const int64_t hn = trained || ad[Q] || ad[K] || ad[V] ? c * d : 0;
  const int64_t hn2 = trained || ad[GATE] || ad[UP] ? c * d : 0;
  const int64_t act = trained || ad[DOWN] ? c * F : 0;
  // Attention keeps q and k after RoPE, v, its output (laid out as o_proj's input) and a
  // float32 logsumexp per head; v is a view of the fused q/k/v output, which it keeps whole,
  // unless an adapter made v a tensor of its own.
  const int64_t attention = c * (q + kv) + (ad[V] ? c * kv : c * (q + 2 * kv)) + c * q + 4 * s.n_heads;
  // silu keeps gate, the product keeps silu's output and up (the fused SwiGLU only gate and up):
  // views of the gate/up output, or tensors of their own where an adapter added to them.
  const int64_t mlp = (ad[GATE] && ad[UP] ? 0 : c * 2 * F) + (ad[GATE] ? c * F : 0) + (ad[UP] ? c * F : 0) +
                      (in.fused_swiglu ? 0 : c * F) + act;
  int64_t adapters = 0;  // x A^T [tokens, rank] per adapter
  for (bool a : ad) adapters += a ? c * in.lora_rank : 0;
  // Qwen3's per-head q/k RMSNorm: a float32 rstd per head; the CPU's composite norm also the
  // float32 normalized q/k when its weights are trained; an adapted q or k is a tensor of its
  // own, kept as the norm's input (else the input is a view of the q/k/v output, kept anyway).
  // (Exact for full fine-tuning and for adapters on both q and k; with an adapter on only one of
  // them, the first block keeps less and the others may keep the q/k/v output whole.)
  const int64_t qk = s.q_dim() + s.kv_dim();
  const int64_t qk_norm = !s.qk_norm() ? 0
                                       : 4 * (s.n_heads + s.n_kv_heads) + (!in.fused_norm && trained ? 4 * qk : 0) +
                                             (ad[Q] ? c * q : 0) + (ad[K] ? c * kv : 0);
  const int64_t full_block = N * (2 * norm + hn + hn2 + attention + mlp + adapters + qk_norm);
  ActivationEstimate e;
  e.layers = s.n_layers;
  e.per_block_bytes = in.checkpointing ? N * c * d : full_block;  // checkpointing: the block's input
  e.recompute_bytes = in.checkpointing ? full_block : 0;
  // The final norm; the loss computes its gradients in forward and keeps them: w.r.t. the
  // hidden states (compute dtype), the output weight (float32) and a LoRA output adapter's A
  // and B (float32).
  e.head_bytes = N * (norm + c * d) + (trained ? 4 * s.vocab_size * d : 0) +
                 (in.lora_output ? 4 * in.lora_rank * (d + s.vocab_size) : 0);
  // A frozen embedding's output needs no gradient: the first block's first norm keeps nothing.
  e.first_block_bytes = e.per_block_bytes - (!trained && !in.checkpointing ? N * norm : 0);
  const int64_t packed_tokens = in.packed_rows * in.packed_len;
  e.mask_bytes = packed_tokens * in.packed_len * c + packed_tokens * (8 + 2 * 4 * (s.head_dim / 2)) +
                 in.windowed_len * in.windowed_len * c;
  if (in.checkpointing && in.offloading) {  // the inputs move to the host
    e.host_bytes = s.n_layers * e.per_block_bytes;
    e.in_flight_bytes = std::min(in.offload_in_flight, s.n_layers) * e.per_block_bytes;
    e.per_block_bytes = e.first_block_bytes = 0;
  }
  return e;
}

int64_t PeakPlan::forward_start_bytes() const {
  return state.total_state_bytes() - state.grad_bytes + state.frozen_base_bytes + forward_grad_bytes + workspace.bytes;
}

int64_t PeakPlan::forward_bytes() const {
  return forward_start_bytes() + activations.saved_bytes() + forward_transient_bytes;
}

int64_t PeakPlan::backward_bytes() const {
  return state.total_state_bytes() - state.grad_bytes + state.frozen_base_bytes +
         std::max(backward_held_bytes + backward_transient_bytes, backward_end_bytes) + workspace.bytes;
}

int64_t PeakPlan::optimizer_bytes() const {
  return state.total_state_bytes() + state.frozen_base_bytes + optimizer_transient_bytes + workspace.bytes;
}

int64_t PeakPlan::peak_bytes() const { return std::max({forward_bytes(), backward_bytes(), optimizer_bytes()}); }

LibraryWorkspace library_workspace(const Config& c) {
  if (c.training.device == DeviceChoice::cpu) return {0, "none on the CPU"};
#ifdef PTRAIN_CUDA
  // Once per process: a second probe would find the workspaces already there.
  static const std::optional<LibraryWorkspace> measured = []() -> std::optional<LibraryWorkspace> {
    if (!at::hasCUDA() || c10::cuda::device_count() == 0) return std::nullopt;
    const c10::DeviceIndex device = c10::cuda::current_device();
    const auto allocated = [&] {
      c10::cuda::device_synchronize();
      return c10::cuda::CUDACachingAllocator::getDeviceStats(device).allocated_bytes[0].current;
    };
    // The allocator keeps no statistics for a device before its first allocation there.
    at::empty({1}, at::TensorOptions().device(c10::kCUDA, device));
    const int64_t before = allocated();
    for (const auto dtype : {at::kBFloat16, at::kFloat}) {
      const auto on = at::TensorOptions().device(c10::kCUDA, device).dtype(dtype);
      const at::Tensor x = at::ones({64, 64}, on).requires_grad_(), w = at::ones({64, 64}, on), b = at::ones({64}, on);
      at::linear(x, w, b).sum().backward();  // autograd's device thread runs the backward matmul
    }
    return LibraryWorkspace{allocated() - before,
                            "measured: cuBLAS / cuBLASLt workspaces of the forward and autograd threads on " +
                                std::string(at::cuda::getDeviceProperties(device)->name)};
  }();
  if (measured) return *measured;
#endif
  return {int64_t{2} * (32 + 1) * 1024 * 1024,
          "no GPU visible: 2 threads x (32 MiB cuBLAS + 1 MiB cuBLASLt), as measured on an H100 with torch 2.11"};
}

ActivationInputs activation_inputs(const Config& c) {
  ActivationInputs in;
  // a preference micro-batch is micro_batch_size pairs: twice the rows (data/rows.h PairRows); KTO's
  // holds each example and its KL sequence (KtoRows), only the examples with autograd: planned as
  // DPO's, an upper bound
  in.tokens = c.data.micro_batch_size * c.data.seq_len * (is_preference(c.training.objective) ? 2 : 1);
  if (c.data.packing) in.packed_rows = c.data.micro_batch_size, in.packed_len = c.data.seq_len;
  const int64_t window = c.model.shape.sliding_window;
  if (!c.data.packing && window > 0 && c.data.seq_len > window) in.windowed_len = c.data.seq_len;
  in.compute_bytes = static_cast<int64_t>(c10::elementSize(precision_policy(c).compute_dtype));
  in.checkpointing = c.memory.activation_checkpointing == Checkpointing::full;
  in.offloading = c.memory.activation_offloading;
  in.offload_in_flight = c.training.device == DeviceChoice::cpu ? 0 : ActivationOffloader::kInFlight;
  in.fused_norm = c.training.device != DeviceChoice::cpu;  // the plan is for GPUs unless the config says CPU
  in.fused_swiglu = c.kernels.fused_swiglu;
  const auto& t = c.lora.targets;
  auto targeted = [&](const std::string& name) {
    return c.lora.enabled && std::find(t.begin(), t.end(), name) != t.end();
  };
  in.lora = c.lora.enabled;
  in.lora_rank = c.lora.rank;
  in.lora_output = targeted("output");
  const auto projections = block_projections(c.model.shape);
  for (size_t i = 0; i < projections.size(); ++i) in.adapted[i] = targeted(projections[i].target);
  return in;
}

PeakPlan predict_peak(const Config& c, int world_size) {
  const PrecisionPolicy policy = precision_policy(c);
  const auto& s = c.model.shape;
  PeakPlan p;
  p.state = predict_memory(c, world_size);
  const int64_t cb = c10::elementSize(policy.compute_dtype), rb = c10::elementSize(policy.reduce_dtype);
  const bool lora = c.lora.enabled;
  const ActivationInputs in = activation_inputs(c);
  p.activations = predict_activations(s, in);
  // A unit gathered whole: a buffer of shard_numel x world_size elements, nothing when one rank
  // uses its shard in place (same dtype: a LoRA base is stored in the compute dtype). A block is
  // its base unit (the norms and biases alone with an NF4 base), its NF4 bytes and its adapters
  // (model/plan.h).
  const ModelPlan plan = model_plan(c);
  const bool nf4 = !plan.nf4.empty();
  auto gathered_unit = [&](const PlannedUnit& u) {
    if (world_size == 1 && u.stored == u.gathered) return int64_t{0};
    return shard_numel(u.layout.numel, world_size) * world_size * static_cast<int64_t>(c10::elementSize(u.gathered));
  };
  int64_t gathered_block = gathered_unit(plan.base.at(kFirstBlockUnit));
  if (!plan.nf4.empty()) gathered_block += gathered_unit(plan.nf4.at(kFirstBlockUnit));
  if (!plan.adapters.empty()) gathered_block += gathered_unit(plan.adapters.at(kFirstBlockUnit));
  // The output projection: the head unit, and the embedding's when it is tied (and adapters).
  int64_t gathered_head = gathered_unit(plan.base.back()) + (s.tie_embeddings ? gathered_unit(plan.base.front()) : 0);
  if (!plan.adapters.empty()) gathered_head += gathered_unit(plan.adapters.back());
  const int64_t block = plan.full.at(kFirstBlockUnit).numel;
  const int64_t chunk = c.memory.loss_chunk_tokens > 0 ? c.memory.loss_chunk_tokens : default_loss_chunk(s.vocab_size);
  const int64_t N = in.tokens;
  // End of forward: the gathered head, the loss's input (the final norm's output) and one
  // chunk's logits at their fullest (model/loss.h loss_chunk_bytes_per_logit).
  const bool fused_loss = c.kernels.fused_loss && in.fused_norm;
  const int64_t logits_bytes = c10::elementSize(policy.logits_dtype);
  const int64_t per_logit =
      loss_chunk_bytes_per_logit(logits_bytes, in.lora_output ? 4 : cb, cb, in.lora_output, fused_loss);
  // DPO's policy pass also computes each token's statistics (model/loss.h TokenStat) from a
  // chunk's logits before scoring them, and keeps them through the step; so does SFT's forward
  // on a step it logs (TRL's entropy and mean_token_accuracy: step 1 always).
  const int64_t chunk_logits = std::min(chunk, N) * s.vocab_size;
  int64_t chunk_bytes = chunk_logits * per_logit;
  if (has_reference(c.training.objective) || (c.training.objective == Objective::sft && c.training.token_metrics))
    chunk_bytes = std::max(chunk_bytes, chunk_logits * logits_bytes + token_stats_bytes(s.vocab_size, logits_bytes)) +
                  N * TokenStat::count * 4;
  const int64_t head_end = gathered_head + N * s.dim * cb + chunk_bytes;
  // A block's flat gradient in the compute dtype and the padded reduce-scatter buffer (trained
  // units only; reduce_grad copies the gradient only to pad it or to change its dtype).
  const bool copies = shard_numel(block, world_size) * world_size != block || cb != rb;
  const int64_t unit_grad = lora ? 0 : block * cb + (copies ? shard_numel(block, world_size) * world_size * rb : 0);
  const int64_t widest = std::max(2 * s.ffn_dim, s.q_dim() + 2 * s.kv_dim());
  // NF4: a 4-bit linear dequantizes one matrix group at a time (each module straight into its
  // rows of the group's buffer), for its forward and its backward.
  const int64_t dequantized = nf4 ? widest * s.dim * cb : 0;
  // Temporaries of a block's forward or backward beyond what it saves: a few [tokens, widest]
  // tensors at most (the gradients flowing through it; in forward, outputs not yet added).
  const int64_t working = 3 * N * cb * widest;
  const int64_t gathered = (c.parallel.prefetch ? 2 : 1) * gathered_block;
  // A block's forward: this and the prefetched block gathered, its working tensors and, with
  // checkpointing, its full activations (kept until the block ends, then dropped).
  const int64_t block_forward = gathered + dequantized + working + p.activations.recompute_bytes;
  p.forward_transient_bytes = std::max(head_end, block_forward);
  // Offloading: the block's input fetched back and the previous block's, prefetched.
  const int64_t fetched = in.checkpointing && in.offloading ? 2 * N * cb * s.dim : 0;
  p.backward_transient_bytes = gathered + unit_grad + dequantized + working + p.activations.recompute_bytes + fetched;
  if (is_preference(c.training.objective)) {
    // Per-token log-probabilities (train/preference.h): their backward recomputes each chunk's
    // logits, so backward starts at the head's forward end again; a tied head keeps the
    // embedding gathered through backward for it.
    const int64_t held_embedding = s.tie_embeddings ? gathered_unit(plan.base.front()) : 0;
    p.backward_transient_bytes = std::max(p.backward_transient_bytes + held_embedding, head_end);
  }
  // Gradient shards: zero_grad frees them at a step's start, backward makes them unit by unit
  // (the head's and the embedding's first: a tied embedding's gradient arrives with the head's).
  // Without accumulation forward holds none, and backward at most every block's activations with
  // the non-block gradients, or every gradient with block 0's activations.
  int64_t grads_outside_blocks = 0;
  for (size_t piece : {size_t{0}, plan.trained().size() - 1}) {
    const PlannedUnit& u = plan.trained().at(piece);
    if (u.trained && !c.optimizer.in_backward)
      grads_outside_blocks += shard_numel(u.layout.numel, world_size) * c10::elementSize(u.stored);
  }
  int64_t largest_unit = 0;
  for (const PlannedUnit& u : plan.trained())
    if (u.trained) largest_unit = std::max(largest_unit, shard_numel(u.layout.numel, world_size));
  p.optimizer_transient_bytes = largest_unit * 4 * (policy.kahan ? 7 : 1) + p.activations.mask_bytes;
  const ActivationEstimate& a = p.activations;
  const int64_t block_zero = a.first_block_bytes + a.mask_bytes + a.in_flight_bytes;
  if (c.training.grad_accum_steps > 1) {
    p.forward_grad_bytes = p.state.grad_bytes;
    p.backward_held_bytes = p.state.grad_bytes + a.saved_bytes();
  } else {
    p.backward_held_bytes = std::max(a.saved_bytes() + grads_outside_blocks, p.state.grad_bytes + block_zero);
  }
  // After block 0: a trained embedding's backward, its dense gradient and the flat one it is
  // reduced from, beside every other gradient (no block's transient any more).
  p.backward_end_bytes = p.state.grad_bytes + block_zero + (lora ? 0 : 2 * s.vocab_size * s.dim * cb);
  p.workspace = library_workspace(c);
  return p;
}

namespace {
// The run's peak before PhasePeak's latest reset of the allocator's (per device index).
std::array<int64_t, 64> g_peak_before_reset{};
}  // namespace

PeakMemory peak_memory(const c10::Device& device) {
#ifdef PTRAIN_CUDA
  if (device.is_cuda()) {
    const c10::DeviceIndex index = device.index() < 0 ? 0 : device.index();
    auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
    return {std::max(stats.allocated_bytes[0].peak, g_peak_before_reset.at(index)), "cuda_allocator_peak_allocated"};
  }
#endif
  // The process's own high-water mark: VmHWM, which exec resets. (getrusage's ru_maxrss carries
  // the launcher's peak into its child across fork + exec: a tiny run started by a Python driver
  // holding 3 GiB would report 3 GiB.)
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);)
    if (line.rfind("VmHWM:", 0) == 0) return {std::stoll(line.substr(6)) * 1024, "process_peak_rss"};
  throw RuntimeError("/proc/self/status has no VmHWM line: the process's peak memory cannot be measured");
}

PhasePeak::PhasePeak(const c10::Device& device) : device_(device) {
#ifdef PTRAIN_CUDA
  if (!device_.is_cuda()) return;
  const c10::DeviceIndex index = device_.index() < 0 ? 0 : device_.index();
  int64_t& before = g_peak_before_reset.at(index);
  const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(index);
  before = std::max(before, stats.allocated_bytes[0].peak);
  start_ = stats.allocated_bytes[0].current;
  c10::cuda::CUDACachingAllocator::resetPeakStats(index);
#endif
}

int64_t PhasePeak::peak() const {
#ifdef PTRAIN_CUDA
  if (device_.is_cuda())
    return c10::cuda::CUDACachingAllocator::getDeviceStats(device_.index() < 0 ? 0 : device_.index())
        .allocated_bytes[0]
        .peak;
#endif
  return -1;
}

}  // namespace ptrain
