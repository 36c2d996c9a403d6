#include "model/rope.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#ifdef PTRAIN_CUDA
#include "common/cuda_stream.h"
#include "rope_cuda.h"
#endif

namespace ptrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

#ifdef PTRAIN_CUDA
bool rope_kernel_applies(const at::Tensor& x, const at::Tensor& cos) {
  return x.is_cuda() && (x.scalar_type() == at::kFloat || x.scalar_type() == at::kBFloat16) &&
         cos.scalar_type() == at::kFloat && x.size(3) % 2 == 0;
}

// x [B, T, H, D] as the kernel reads it: unit element stride, heads D apart, rows (B*T of them)
// evenly apart — a view of the q/k/v output keeps its row stride; anything else is copied.
at::Tensor as_kernel_rows(const at::Tensor& x) {
  const bool fits = x.stride(3) == 1 && x.stride(2) == x.size(3) && x.stride(0) == x.size(1) * x.stride(1);
  return fits ? x : x.contiguous();
}

// The tables as the kernel reads them, [rows or T, D/2], and the period of their rows.
struct KernelTables {
  at::Tensor cos, sin;
  int64_t period = 0;
};
KernelTables kernel_tables(const at::Tensor& cos, const at::Tensor& sin, int64_t B, int64_t T) {
  const int64_t half = cos.size(-1);
  if (cos.size(0) == 1) return {cos.reshape({T, half}).contiguous(), sin.reshape({T, half}).contiguous(), T};
  return {cos.reshape({B * T, half}).contiguous(), sin.reshape({B * T, half}).contiguous(), 0};
}

kernels::RopeShape rope_kernel_shape(const at::Tensor& x_rows, int64_t period) {
  return {x_rows.size(0) * x_rows.size(1),      x_rows.size(2), x_rows.size(3), x_rows.stride(1), period,
          x_rows.scalar_type() == at::kBFloat16};
}

#endif

class FusedRope : public torch::autograd::Function<FusedRope> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
    ctx->save_for_backward({cos, sin});
    ctx->saved_data["dtype"] = x.scalar_type();
    return rope_forward(x, cos, sin);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    return {rope_backward(grads[0], saved[0], saved[1], ctx->saved_data["dtype"].toScalarType()), at::Tensor(),
            at::Tensor()};
  }
};

}  // namespace

at::Tensor rope_forward_reference(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  auto halves = x.to(at::kFloat).chunk(2, -1);  // split's backward writes once, narrow's zero-fills
  const at::Tensor &x1 = halves[0], &x2 = halves[1];
  return at::cat({x1 * cos - x2 * sin, x2 * cos + x1 * sin}, -1).to(x.scalar_type());
}

// The composite path's backward, operation for operation: the cast's (to float32), the
// concatenation's (the halves g1, g2), then the products' and sums' — x1 receives g1 c + g2 s,
// x2 receives g2 c - g1 s (two terms each: their order cannot change a bit) — then the halves
// joined and cast back.
at::Tensor rope_backward_reference(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin,
                                   c10::ScalarType dtype) {
  auto halves = grad.to(at::kFloat).chunk(2, -1);
  const at::Tensor &g1 = halves[0], &g2 = halves[1];
  return at::cat({g1 * cos + g2 * sin, g2 * cos - g1 * sin}, -1).to(dtype);
}

at::Tensor rope_forward(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && cos.sizes() == sin.sizes() && cos.size(-1) * 2 == x.size(3),
              "rope: x must be [B, T, heads, head_dim] and cos/sin [.., head_dim/2]");
#ifdef PTRAIN_CUDA
  if (rope_kernel_applies(x, cos)) {
    const at::Tensor rows = as_kernel_rows(x);
    const KernelTables t = kernel_tables(cos, sin, x.size(0), x.size(1));
    at::Tensor out = at::empty(x.sizes(), x.options().memory_format(at::MemoryFormat::Contiguous));
    kernels::rope_forward(rope_kernel_shape(rows, t.period), rows.data_ptr(), t.cos.data_ptr<float>(),
                          t.sin.data_ptr<float>(), out.data_ptr(), cuda_stream_of(x));
    return out;
  }
#endif
  return rope_forward_reference(x, cos, sin);
}

at::Tensor rope_backward(const at::Tensor& grad, const at::Tensor& cos, const at::Tensor& sin, c10::ScalarType dtype) {
#ifdef PTRAIN_CUDA
  if (rope_kernel_applies(grad, cos) && grad.scalar_type() == dtype) {
    const at::Tensor g = grad.contiguous();
    const KernelTables t = kernel_tables(cos, sin, g.size(0), g.size(1));
    at::Tensor dx = at::empty_like(g);
    kernels::rope_backward(rope_kernel_shape(g, t.period), g.data_ptr(), t.cos.data_ptr<float>(),
                           t.sin.data_ptr<float>(), dx.data_ptr(), cuda_stream_of(g));
    return dx;
  }
#endif
  return rope_backward_reference(grad, cos, sin, dtype);
}

at::Tensor rope_rotate(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, bool fused) {
  if (!fused) return rope_forward_reference(x, cos, sin);
  return FusedRope::apply(x, cos, sin);
}

}  // namespace ptrain
