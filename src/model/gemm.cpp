#include "model/gemm.h"

#include <ATen/ATen.h>

namespace ptrain::gemm {

namespace {
bool widen_on_cpu(const at::Tensor& t) {
  return t.device().is_cpu() && (t.scalar_type() == at::kBFloat16 || t.scalar_type() == at::kHalf);
}
}  // namespace

at::Tensor linear(const at::Tensor& x, const at::Tensor& w, const at::Tensor& bias) {
  if (!widen_on_cpu(x) && !widen_on_cpu(w)) return at::linear(x, w, bias);
  // Autograd sees the casts: the incoming gradient is widened exactly, both input gradients
  // are computed in float32 and rounded once to the operands' dtype, as a bf16 GEMM would.
  const at::Tensor b = bias.defined() ? bias.to(at::kFloat) : bias;
  return at::linear(x.to(at::kFloat), w.to(at::kFloat), b).to(x.scalar_type());
}

at::Tensor mm(const at::Tensor& a, const at::Tensor& b, c10::ScalarType out_dtype) {
  if (widen_on_cpu(a) || widen_on_cpu(b)) return at::mm(a.to(at::kFloat), b.to(at::kFloat)).to(out_dtype);
  if (a.scalar_type() != b.scalar_type()) {  // e.g. a float32 gradient times bf16 activations
    const c10::ScalarType wide = at::promote_types(a.scalar_type(), b.scalar_type());
    return gemm::mm(a.to(wide), b.to(wide), out_dtype);  // the narrower operand widened, exactly
  }
  if (a.scalar_type() == out_dtype) return at::mm(a, b);
  if (a.is_cuda() && out_dtype == at::kFloat) return at::mm(a, b, out_dtype);  // cuBLAS: bf16 in, fp32 out
  return at::mm(a.to(out_dtype), b.to(out_dtype));
}

void add_mm_(at::Tensor& acc, const at::Tensor& a, const at::Tensor& b) {
  if (acc.is_cuda() && acc.scalar_type() == at::kFloat && a.scalar_type() == b.scalar_type() &&
      (a.scalar_type() == at::kBFloat16 || a.scalar_type() == at::kHalf)) {
    at::addmm_out(acc, acc, a, b, at::kFloat);
    return;
  }
  if (acc.scalar_type() == a.scalar_type() && a.scalar_type() == b.scalar_type() && !widen_on_cpu(a)) {
    acc.addmm_(a, b);
    return;
  }
  acc.add_(gemm::mm(a, b, acc.scalar_type()));
}

}  // namespace ptrain::gemm
