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

// The graph refers to the NF4 weight by address: it is the model's own (already resident)
// storage, which outlives every graph built over it, so "saving" it costs nothing.
const nf4::Quantized& weight_of(AutogradContext* ctx) {
  return *saved_ref_of<const nf4::Quantized>(ctx->saved_data["w"]);
}

class Linear4bitFn : public torch::autograd::Function<Linear4bitFn> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const nf4::Quantized* w) {
    ctx->saved_data["w"] = saved_ref(w);
    // Custom Function forward runs with grad mode off: the dequantized temporary is never saved.
    at::Tensor dense = nf4::dequantize(*w, x.scalar_type());
    return gemm::linear(x, dense);
  }
  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const at::Tensor& g = grads[0];
    at::Tensor dense = nf4::dequantize(weight_of(ctx), g.scalar_type());  // again; freed on return
    at::Tensor flat = g.reshape({-1, g.size(-1)});
    at::Tensor gx = gemm::mm(flat, dense, g.scalar_type());
    std::vector<int64_t> shape = g.sizes().vec();
    shape.back() = dense.size(1);
    return {gx.view(shape), at::Tensor()};
  }
};

}  // namespace

at::Tensor linear4bit(const at::Tensor& x, const nf4::Quantized& weight) {
  TORCH_CHECK(weight.shape.size() == 2 && x.size(-1) == weight.shape[1], "linear4bit: input has ", x.size(-1),
              " features, the weight expects ", weight.shape.size() == 2 ? weight.shape[1] : -1);
  return Linear4bitFn::apply(x, &weight);
}

}  // namespace ptrain
