#include "parallel/options.h"

namespace ptrain {

OptionProblems PrecisionOptions::problems() const {
  OptionProblems p;
  const bool fp32 = mode == PrecisionMode::fp32, bf16 = mode == PrecisionMode::bf16;
  p.check("precision.param_dtype",
          bf16 && param_dtype == DtypeName::float32
              ? "mode \"bf16\" stores bfloat16 parameters; float32 compute over them gains nothing — use mode = "
                "\"mixed\" for float32 master weights"
              : "");
  p.check("precision.param_dtype", fp32 && param_dtype == DtypeName::bfloat16
                                       ? "mode \"fp32\" computes in float32; remove param_dtype or use mode = \"mixed\""
                                       : "");
  p.check("precision.param_dtype",
          mode == PrecisionMode::mixed && param_dtype == DtypeName::float32
              ? "mode \"mixed\" computes in bfloat16 over float32 master weights; float32 compute is mode = \"fp32\""
              : "");
  p.check("precision.reduce_dtype",
          fp32 && reduce_dtype == DtypeName::bfloat16
              ? "mode \"fp32\" reduces gradients in float32; remove reduce_dtype or use mode = \"mixed\""
              : "");
  p.check("precision.logits_dtype",
          fp32 && logits_dtype == DtypeName::bfloat16
              ? "mode \"fp32\" computes logits in float32; remove logits_dtype or use mode = \"mixed\" or \"bf16\""
              : "");
  p.check("precision.logits_dtype",
          !fp32 && logits_dtype == DtypeName::bfloat16 && !allow_bf16_logits
              ? "bfloat16 logits save at most one loss chunk (memory.loss_chunk_tokens) and round the loss; set "
                "logits_dtype = \"float32\", or opt in with precision.allow_bf16_logits = true"
              : "");
  p.check("precision.allow_bf16_logits", allow_bf16_logits && logits_dtype != DtypeName::bfloat16
                                             ? "only meaningful with logits_dtype = \"bfloat16\"; remove it"
                                             : "");
  p.check("precision.rope_dtype", rope_dtype == DtypeName::float32
                                      ? ""
                                      : "RoPE is computed in float32 in every mode; set rope_dtype = \"float32\"");
  p.check("precision.stochastic_rounding",
          stochastic_rounding && !bf16
              ? "stochastic rounding applies to bf16 parameters only (mode = \"bf16\"); set it to false"
              : "");
  if (kahan_summation && !bf16)
    p.check("precision.kahan_summation",
            "Kahan summation applies to bf16 parameters only (mode = \"bf16\"); set it to false");
  else if (kahan_summation && stochastic_rounding)
    p.check("precision.kahan_summation",
            "Kahan summation and stochastic_rounding are two ways to keep small bf16 updates; choose one");
  return p;
}

OptionProblems ParallelOptions::problems() const {
  OptionProblems p;
  p.check("parallel.backend", backend == Backend::gloo
                                  ? "the torch 2.11.0 wheel ships no gloo headers; use \"mpi\" for CPU collectives"
                                  : "");
  p.check("parallel.timeout_s", positive(timeout_s));
  return p;
}

OptionProblems MemoryOptions::problems() const {
  OptionProblems p;
  p.check("memory.activation_offloading",
          activation_offloading && !checkpointing()
              ? "offloading moves the inputs full activation checkpointing keeps; set "
                "memory.activation_checkpointing = \"full\" or memory.activation_offloading = false"
              : "");
  p.check("memory.loss_chunk_tokens", at_least(loss_chunk_tokens, 0));
  return p;
}

}  // namespace ptrain
