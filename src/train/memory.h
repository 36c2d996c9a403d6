// Memory truth: bytes of persistent state summed from the actual tensors (measure) and the
// same numbers predicted from the config alone (predict, used by `ptrain check`), plus the
// process / allocator peak.
#pragma once
#include <c10/core/Device.h>

#include <array>
#include <cstdint>
#include <string>

namespace ptrain {

struct Config;
struct LlamaShape;
class FsdpModel;
class Optimizer;

struct MemoryReport {
  int rank = 0;
  int world_size = 1;
  int64_t num_params = 0;             // parameter elements held by this rank (its padded shards)
  int64_t param_bytes = 0;            // sharded parameters (in fp32/mixed they are the master copy)
  int64_t grad_bytes = 0;             // gradient shards
  int64_t optimizer_state_bytes = 0;  // optimizer moments
  int64_t master_weight_bytes = 0;    // extra master copies beyond param_bytes (none in fp32/mixed)
  int64_t frozen_base_bytes = 0;      // LoRA: the frozen base weights (not trained, no grads or state)
  int64_t nf4_params = 0;             // NF4 base: weights of the model held in 4 bits (part of the frozen base)
  int64_t nf4_bytes = 0;              //   this rank's shards of their packed codes + scales
  // Bytes per 4-bit weight over all ranks (~0.516 with double quantization, + alignment padding).
  double nf4_bytes_per_param() const {
    return nf4_params ? static_cast<double>(nf4_bytes) * world_size / nf4_params : 0.0;
  }
  // Trainable state; with LoRA num_params counts adapter parameters and the frozen base is
  // reported apart (frozen_base_bytes).
  int64_t total_state_bytes() const { return param_bytes + grad_bytes + optimizer_state_bytes + master_weight_bytes; }
  std::string to_json() const;
};

MemoryReport measure_memory(const FsdpModel& model, const Optimizer& optim);
MemoryReport predict_memory(const Config& config, int world_size);

// What one micro-batch's forward leaves alive for backward, per rank, predicted from the shape
// and the checkpointing policy: the tensors autograd saves (inputs of every matmul, norm and
// attention; the loss's gradients, computed in forward). Validated against the bytes LibTorch
// actually allocates (Memory.SavedActivationsMatchPrediction).
struct ActivationEstimate {
  int64_t per_block_bytes = 0;    // one block's saved tensors (its input alone with activation checkpointing)
  int64_t recompute_bytes = 0;    // activation checkpointing: one block's full saved tensors, rebuilt in backward
  int64_t head_bytes = 0;         // final norm's input + the loss's saved gradients (hidden; output weight in fp32)
  int64_t first_block_bytes = 0;  // block 0: less with LoRA (its input needs no gradient)
  int64_t layers = 0;
  // Activation offloading: the blocks' kept inputs in host memory (none of them counted above),
  // and those still on the device waiting for their copy to finish.
  int64_t host_bytes = 0;
  int64_t in_flight_bytes = 0;
  // Packed rows (data.packing), one set for all blocks: the additive attention mask [B, 1, T, T]
  // in the compute dtype, each token's position (int64) and its RoPE cos/sin (float32). Rows
  // longer than a sliding window, unpacked: the mask alone, [1, 1, T, T].
  int64_t mask_bytes = 0;
  int64_t saved_bytes() const {
    return first_block_bytes + (layers - 1) * per_block_bytes + head_bytes + in_flight_bytes + mask_bytes;
  }
};
struct ActivationInputs {
  int64_t tokens = 0;                       // micro_batch_size x seq_len
  int64_t packed_rows = 0, packed_len = 0;  // data.packing: micro_batch_size, seq_len (else 0)
  int64_t windowed_len = 0;                 // unpacked rows longer than the sliding window: seq_len (else 0)
  int64_t compute_bytes = 4;                // element size of activations (4 fp32, 2 bf16)
  bool checkpointing = false;               // memory.activation_checkpointing = "full"
  bool offloading = false;                  // memory.activation_offloading (with checkpointing)
  int64_t offload_in_flight = 0;  //   block inputs on the device awaiting their copy (0: synchronous CPU copies)
  bool fused_norm = true;         // CUDA's fused RMSNorm (false: the CPU's composite one)
  bool fused_swiglu = true;       // kernels.fused_swiglu (on by default): silu's output is not kept
  bool lora = false;              // a frozen base: only adapters are trained
  int64_t lora_rank = 0;
  std::array<bool, 7> adapted{};  // LoRA: q, k, v, o, gate, up, down carry an adapter
  bool lora_output = false;       // LoRA: an adapter on the output projection
};
ActivationEstimate predict_activations(const LlamaShape& shape, const ActivationInputs& in);
// The inputs a config implies (its micro-batch, compute dtype, checkpointing, LoRA targets; the
// fused norm unless training.device is "cpu").
ActivationInputs activation_inputs(const Config& config);

// The allocator peak of one rank during a training step, predicted from the config (`ptrain
// check`): the larger of its phases'. Forward: persistent state without the gradient shards
// (zero_grad frees them at the step's start; with accumulation micro-batch 2 on has them all),
// the saved activations and the larger of the end of forward (the gathered output projection,
// the loss's input, one loss chunk) and a block's forward (two gathered blocks with prefetch,
// gradient-sized temporaries, the block's full activations under checkpointing). Backward: the
// saved activations and gradient shards never all alive together (backward frees a block's
// activations as its gradient arrives), plus a block's backward transient (two gathered blocks,
// its flat gradient and reduce buffer, activation gradients, the recomputed block). The
// optimizer: the whole state.
// cuBLAS's workspaces: allocated through the caching allocator at a thread's first matmul and
// kept for the process's life, one per cuBLAS handle and stream — the forward thread's and
// autograd's device thread's (each a cuBLAS and, for a matmul with bias, a cuBLASLt workspace).
// Measured in this process where a GPU is visible (the same two threads, both dtypes), else the
// sizes measured on an H100 with torch 2.11 and no CUBLAS_WORKSPACE_CONFIG.
struct LibraryWorkspace {
  int64_t bytes = 0;
  std::string source;  // how `bytes` was obtained
};
LibraryWorkspace library_workspace(const Config& config);

struct PeakPlan {
  MemoryReport state;
  ActivationEstimate activations;
  int64_t forward_transient_bytes = 0;
  int64_t backward_transient_bytes = 0;
  // Gradient shards alive in forward: all of them with accumulation, else none.
  int64_t forward_grad_bytes = 0;
  // Saved activations and gradient shards beside a block's backward transient, at the fullest
  // block: the last (every block's activations, the embedding's and head's gradients) or the
  // first (every gradient, block 0's activations); both whole with accumulation.
  int64_t backward_held_bytes = 0;
  // Backward's last step, a trained embedding's (then no block transient is alive).
  int64_t backward_end_bytes = 0;
  // The optimizer's step: float32 temporaries of its largest unit (seven with Kahan summation's
  // unfused update), and a packed micro-batch's attention mask, which lives until the next.
  int64_t optimizer_transient_bytes = 0;
  LibraryWorkspace workspace;
  // What a step holds as its forward starts (the state, less the gradients it has freed, and the
  // library workspace) and as backward starts (that + the saved activations), to set against a
  // CUDA run's allocated bytes at those points (metrics.jsonl).
  int64_t forward_start_bytes() const;
  int64_t backward_start_bytes() const { return forward_start_bytes() + activations.saved_bytes(); }
  int64_t forward_bytes() const;
  int64_t backward_bytes() const;
  int64_t optimizer_bytes() const;
  int64_t peak_bytes() const;
};
PeakPlan predict_peak(const Config& config, int world_size);

struct PeakMemory {
  int64_t bytes = 0;
  std::string source;  // "cuda_allocator_peak_allocated" or "process_peak_rss"
};
PeakMemory peak_memory(const c10::Device& device);

// The CUDA allocator's peak allocated bytes within one phase of a step (forward, backward, the
// optimizer), to set against the planner's terms: made at the phase's start, it resets the
// allocator's peak — folding the peak so far into peak_memory()'s, which stays the run's — and
// peak() is the highest allocation since. -1 off CUDA (the process's RSS has no phases).
class PhasePeak {
 public:
  explicit PhasePeak(const c10::Device& device);
  int64_t peak() const;
  int64_t start() const { return start_; }  // the allocated bytes as the phase began (-1 off CUDA)

 private:
  c10::Device device_;
  int64_t start_ = -1;
};

}  // namespace ptrain
