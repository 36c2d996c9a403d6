#include "model/swiglu.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef PTRAIN_CUDA
#include "common/cuda_stream.h"
#include "swiglu_cuda.h"
#endif

namespace ptrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef PTRAIN_CUDA
bool swiglu_kernel_applies(const at::Tensor& t) {
  return t.is_cuda() && (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16);
}

// [..., cols] as [rows, cols] with unit column stride: a view where the layout allows (a chunk of
// the gate/up output), else a contiguous copy.
at::Tensor as_rows(const at::Tensor& t) {
  const at::Tensor unit = t.stride(-1) == 1 ? t : t.contiguous();
  return unit.reshape({-1, t.size(-1)});
}

kernels::SwigluShape swiglu_kernel_shape(const at::Tensor& gate_rows, const at::Tensor& up_rows) {
  return {gate_rows.size(0), gate_rows.size(1), gate_rows.stride(0), up_rows.stride(0),
          gate_rows.scalar_type() == at::kBFloat16};
}

#endif

class FusedSwiglu : public torch::autograd::Function<FusedSwiglu> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& gate, const at::Tensor& up) {
    ctx->save_for_backward({gate, up});
    return swiglu_forward(gate, up);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    auto [dgate, dup] = swiglu_backward(grads[0], saved[0], saved[1]);
    return {dgate, dup};
  }
};

}  // namespace

at::Tensor swiglu_forward_reference(const at::Tensor& gate, const at::Tensor& up) { return at::silu(gate) * up; }

// The composite path's backward, operation for operation: mul's gradients (grad * up,
// grad * silu(gate)), then silu's.
std::pair<at::Tensor, at::Tensor> swiglu_backward_reference(const at::Tensor& grad, const at::Tensor& gate,
                                                            const at::Tensor& up) {
  return {at::silu_backward(grad * up, gate), grad * at::silu(gate)};
}

at::Tensor swiglu_forward(const at::Tensor& gate, const at::Tensor& up) {
  TORCH_CHECK(gate.sizes() == up.sizes() && gate.scalar_type() == up.scalar_type(),
              "swiglu: gate and up must have one shape and dtype");
#ifdef PTRAIN_CUDA
  if (swiglu_kernel_applies(gate)) {
    const at::Tensor g = as_rows(gate), u = as_rows(up);
    at::Tensor out = at::empty(gate.sizes(), gate.options().memory_format(at::MemoryFormat::Contiguous));
    kernels::swiglu_forward(swiglu_kernel_shape(g, u), g.data_ptr(), u.data_ptr(), out.data_ptr(),
                            cuda_stream_of(gate));
    return out;
  }
#endif
  return swiglu_forward_reference(gate, up);
}

std::pair<at::Tensor, at::Tensor> swiglu_backward(const at::Tensor& grad, const at::Tensor& gate,
                                                  const at::Tensor& up) {
#ifdef PTRAIN_CUDA
  if (swiglu_kernel_applies(gate) && grad.scalar_type() == gate.scalar_type()) {
    const at::Tensor g = as_rows(gate), u = as_rows(up), dy = grad.contiguous();
    const auto options = gate.options().memory_format(at::MemoryFormat::Contiguous);
    at::Tensor dgate = at::empty(gate.sizes(), options), dup = at::empty(gate.sizes(), options);
    kernels::swiglu_backward(swiglu_kernel_shape(g, u), dy.data_ptr(), g.data_ptr(), u.data_ptr(), dgate.data_ptr(),
                             dup.data_ptr(), cuda_stream_of(gate));
    return {dgate, dup};
  }
#endif
  return swiglu_backward_reference(grad, gate, up);
}

at::Tensor swiglu(const at::Tensor& gate, const at::Tensor& up, bool fused) {
  if (!fused) return at::silu(gate) * up;
  return FusedSwiglu::apply(gate, up);
}

}  // namespace ptrain
