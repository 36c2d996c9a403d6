#include "parallel/precision.h"

#include <sstream>

namespace ptrain {

double PrecisionPolicy::state_bytes_per_param() const {
  // grads are kept in the master dtype after reduction
  const double moments = optim_8bit ? 2.0 * (1.0 + 4.0 / 256.0) : 2.0 * c10::elementSize(optim_dtype);
  return c10::elementSize(master_dtype) * (kahan ? 3.0 : 2.0) + moments;
}

std::string PrecisionPolicy::table() const {
  std::ostringstream o;
  o << "precision mode " << mode << ":\n"
    << "  sharded params (master)  " << c10::toString(master_dtype) << "\n"
    << "  compute / all-gather     " << c10::toString(compute_dtype) << "\n"
    << "  gradient reduce          " << c10::toString(reduce_dtype) << "\n"
    << "  optimizer moments        "
    << (optim_8bit ? std::string("uint8 codes + float32 absmax per 256 (float32 under 4096 elements)")
                   : c10::toString(optim_dtype))
    << "\n"
    << "  logits + loss            " << c10::toString(logits_dtype) << "\n"
    << "  RoPE                     " << c10::toString(rope_dtype) << "\n"
    << "  param update rounding    "
    << (stochastic_rounding ? "stochastic"
        : kahan             ? "nearest + Kahan compensation (a bf16 buffer per param)"
                            : "nearest")
    << "\n"
    << "  persistent state         " << (optim_8bit ? "~" : "") << state_bytes_per_param() << " bytes/param\n";
  return o.str();
}

}  // namespace ptrain
