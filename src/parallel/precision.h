// PrecisionPolicy: which dtype each class of tensor lives in (docs/design.md, "Precision modes"),
// resolved once from [precision] (precision_policy in config/config.h).
#pragma once
#include <c10/core/ScalarType.h>

#include <string>

namespace ptrain {

struct PrecisionPolicy {
  std::string mode = "fp32";
  c10::ScalarType master_dtype = c10::kFloat;   // sharded parameters (the master copy)
  c10::ScalarType compute_dtype = c10::kFloat;  // gathered unit weights and activations
  c10::ScalarType reduce_dtype = c10::kFloat;   // gradient reduction
  c10::ScalarType optim_dtype = c10::kFloat;    // optimizer moments
  c10::ScalarType logits_dtype = c10::kFloat;   // logits and loss
  c10::ScalarType rope_dtype = c10::kFloat;     // RoPE tables and rotation
  bool stochastic_rounding = false;             // bf16 parameter updates rounded stochastically
  bool kahan = false;                           // bf16 updates Kahan-compensated (a bf16 buffer per param)
  bool optim_8bit = false;                      // adamw8bit: moments as uint8 codes + fp32 absmax per 256

  // Bytes of persistent state per parameter: master + grad + optimizer moments (8-bit: 2 code
  // bytes + 8/256 absmax bytes, before float32 moments of tensors under 4096 elements) + the
  // Kahan compensation.
  double state_bytes_per_param() const;
  std::string table() const;  // human-readable "what lives in which dtype"
};

}  // namespace ptrain
