// The parallel part's options, as the config's [precision], [parallel] and [memory] sections
// hold them: each field's initialiser is the key's default (docs/config.md shows them), in this
// one place; FsdpOptions composes [parallel], [memory] and [kernels]. Validation:
// problems() beside each struct (its section's own rules); config/validate.cpp holds the rules
// that read several sections or the machine.
#pragma once
#include <cstdint>

#include "model/options.h"

namespace ptrain {

// [precision]
enum class PrecisionMode { fp32, mixed, bf16 };
enum class DtypeName { from_mode, float32, bfloat16 };  // "" (the mode decides), "float32", "bfloat16"
struct PrecisionOptions {
  PrecisionMode mode = PrecisionMode::fp32;
  DtypeName param_dtype = DtypeName::from_mode;   // compute/all-gather dtype
  DtypeName reduce_dtype = DtypeName::from_mode;  // gradient reduction dtype
  DtypeName logits_dtype = DtypeName::float32;    // bfloat16 only with allow_bf16_logits
  bool allow_bf16_logits = false;                 // explicit opt-in for bfloat16 logits
  DtypeName rope_dtype = DtypeName::float32;      // must be float32 (stated, checked)
  bool stochastic_rounding = false;
  bool kahan_summation = false;     // bf16: a compensation buffer per parameter
  OptionProblems problems() const;  // the dtypes each mode allows, its rounding options
};

// [parallel]
enum class Backend { automatic, nccl, mpi, gloo };  // "auto", ...
struct ParallelOptions {
  Backend backend = Backend::automatic;
  // ZeRO-3: free each unit's gathered weights after its forward (backward re-gathers them).
  bool reshard_after_forward = true;
  // Issue the next unit's all-gather before computing the current one (forward: unit i+1 while
  // block i runs; backward: block i-1 while block i's backward runs), so at most two gathered
  // units are alive. Reduce-scatters are always asynchronous: unit i's is completed when unit
  // i-1's is issued (the embedding's, last, completes at once).
  bool prefetch = true;
  double timeout_s = 600.0;  // collective timeout before a rank is declared dead
  OptionProblems problems() const;
};

// [memory]
enum class Checkpointing { none, full };
struct MemoryOptions {
  // full: each block keeps only its input; backward re-gathers, recomputes the block and
  // differentiates it (implies resharding the block).
  Checkpointing activation_checkpointing = Checkpointing::none;
  // (needs full checkpointing) each block's kept input goes to host memory in forward and comes
  // back ahead of its backward (parallel/offload.h).
  bool activation_offloading = false;
  int64_t loss_chunk_tokens = 0;  // tokens per cross-entropy chunk; 0 = auto
  bool checkpointing() const { return activation_checkpointing == Checkpointing::full; }
  OptionProblems problems() const;
};

// How the sharded model (parallel/fsdp.h) runs its schedule: the sections as configured. What
// it holds — LoRA adapters beside a frozen base, an NF4 base — is its plan's ([lora], [quant]:
// model/plan.h).
struct FsdpOptions {
  ParallelOptions parallel;
  MemoryOptions memory;
  KernelOptions kernels;  // [kernels]: the blocks' fused pieces
};

}  // namespace ptrain
