#include "parallel/precision.h"

#include <sstream>

#include "config/config.h"

namespace ptrain {

PrecisionPolicy PrecisionPolicy::from_config(const Config& c) {
  PrecisionPolicy p;
  p.mode = c.precision.mode;
  auto dtype = [](const std::string& name, c10::ScalarType fallback) {
    if (name == "float32") return c10::kFloat;
    if (name == "bfloat16") return c10::kBFloat16;
    return fallback;
  };
  if (p.mode != "fp32") p.logits_dtype = dtype(c.precision.logits_dtype, c10::kFloat);
  if (p.mode == "mixed") {
    p.compute_dtype = dtype(c.precision.param_dtype, c10::kBFloat16);
    p.reduce_dtype = dtype(c.precision.reduce_dtype, c10::kFloat);
  } else if (p.mode == "bf16") {
    p.master_dtype = p.compute_dtype = p.optim_dtype = c10::kBFloat16;
    p.reduce_dtype = dtype(c.precision.reduce_dtype, c10::kBFloat16);
    p.stochastic_rounding = c.precision.stochastic_rounding;
  }
  p.optim_8bit = c.optimizer.name == "adamw8bit";
  return p;
}

double PrecisionPolicy::state_bytes_per_param() const {
  // grads are kept in the master dtype after reduction
  const double moments = optim_8bit ? 2.0 * (1.0 + 4.0 / 256.0) : 2.0 * c10::elementSize(optim_dtype);
  return c10::elementSize(master_dtype) * 2.0 + moments;
}

std::string PrecisionPolicy::table() const {
  std::ostringstream o;
  o << "precision mode " << mode << ":\n"
    << "  sharded params (master)  " << c10::toString(master_dtype) << "\n"
    << "  compute / all-gather     " << c10::toString(compute_dtype) << "\n"
    << "  gradient reduce          " << c10::toString(reduce_dtype) << "\n"
    << "  optimizer moments        "
    << (optim_8bit ? std::string("uint8 codes + float32 absmax per 256 (float32 under 4096 elements)") : c10::toString(optim_dtype))
    << "\n"
    << "  logits + loss            " << c10::toString(logits_dtype) << "\n"
    << "  RoPE                     " << c10::toString(rope_dtype) << "\n"
    << "  param update rounding    " << (stochastic_rounding ? "stochastic" : "nearest") << "\n"
    << "  persistent state         " << (optim_8bit ? "~" : "") << state_bytes_per_param() << " bytes/param\n";
  return o.str();
}

}  // namespace ptrain
