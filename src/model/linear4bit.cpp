#include "model/linear4bit.h"

#include <ATen/ATen.h>
#include <torch/csrc/autograd/custom_function.h>

#include <cmath>

#include "common/saved_ref.h"
#include "model/gemm.h"

namespace ptrain {

namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// The graph refers to the NF4 modules by address: they are the model's own (already resident)
// storage, which outlives every graph built over it, so "saving" them costs nothing.
const std::vector<const nf4::Quantized*>& modules_of(AutogradContext* ctx) {
  return saved_refs_of<const nf4::Quantized>(ctx->saved_data["w"]);
}

class Linear4bitFn : public torch::autograd::Function<Linear4bitFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const std::vector<const nf4::Quantized*>& w) {
    ctx->saved_data["w"] = saved_refs(w);
    // Custom Function forward runs with grad mode off: the dequantized temporary is never saved.
    return gemm::linear(x, dequantize_rows(w, x.scalar_type()));
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    at::Tensor dense = dequantize_rows(modules_of(ctx), g.scalar_type());  // again; freed on return
    at::Tensor flat = g.reshape({-1, g.size(-1)});
    at::Tensor gx = gemm::mm(flat, dense, g.scalar_type());
    std::vector<int64_t> shape = g.sizes().vec();
    shape.back() = dense.size(1);
    return {gx.view(shape), at::Tensor()};
  }
};

}  // namespace

at::Tensor dequantize_rows(const std::vector<const nf4::Quantized*>& modules, c10::ScalarType dtype) {
  TORCH_CHECK(!modules.empty(), "no NF4 module to dequantize");
  if (modules.size() == 1) return nf4::dequantize(*modules[0], dtype);
  int64_t rows = 0;
  for (const auto* q : modules) rows += q->shape[0];
  at::Tensor dense =
      at::empty({rows, modules[0]->shape[1]}, at::TensorOptions().dtype(dtype).device(modules[0]->packed.device()));
  int64_t row = 0;
  for (const auto* q : modules) {  // each module straight into its rows: no temporary
    nf4::dequantize_into(*q, dense.narrow(0, row, q->shape[0]));
    row += q->shape[0];
  }
  return dense;
}

at::Tensor linear4bit(const at::Tensor& x, const std::vector<const nf4::Quantized*>& modules) {
  for (const auto* q : modules)
    TORCH_CHECK(q->shape.size() == 2 && x.size(-1) == q->shape[1], "linear4bit: input has ", x.size(-1),
                " features, the weight expects ", q->shape.size() == 2 ? q->shape[1] : -1);
  return Linear4bitFn::apply(x, modules);
}

at::Tensor linear4bit(const at::Tensor& x, const nf4::Quantized& weight) {
  return linear4bit(x, std::vector<const nf4::Quantized*>{&weight});
}

}  // namespace ptrain
