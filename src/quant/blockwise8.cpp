#include "quant/blockwise8.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cmath>
#include <vector>

#include "quant/blockwise8_math.h"

namespace ptrain::q8 {

at::Tensor dynamic_map(bool is_signed) {
  // 7 exponent levels i: 2^i (signed) or 2^(i+1) (unsigned) float32 means of linspace(0.1, 1)
  // intervals scaled by 10^(i-6), mirrored for signed; plus 0 and 1, zero padding, sorted. The
  // same ATen ops as bitsandbytes so every float32 rounding agrees.
  std::vector<at::Tensor> parts;
  for (int i = 0; i < 7; ++i) {
    const int64_t items = is_signed ? (1LL << i) + 1 : (1LL << (i + 1)) + 1;
    at::Tensor b = at::linspace(0.1, 1.0, items, at::kFloat);
    at::Tensor means = (b.narrow(0, 0, items - 1) + b.narrow(0, 1, items - 1)) / 2.0;
    const double scale = std::pow(10.0, static_cast<double>(i - 6));
    parts.push_back(means * scale);
    if (is_signed) parts.push_back(means * -scale);
  }
  parts.push_back(at::tensor({0.0f, 1.0f}));
  at::Tensor data = at::cat(parts);
  TORCH_CHECK(data.numel() <= kCodes, "dynamic map has ", data.numel(), " values");
  data = at::cat({data, at::zeros({kCodes - data.numel()}, at::kFloat)});
  return std::get<0>(data.sort());
}

at::Tensor midpoints(const at::Tensor& code) {
  TORCH_CHECK(code.numel() == kCodes && code.scalar_type() == at::kFloat, "a code has 256 float32 values");
  return (code.narrow(0, 0, kCodes - 1) + code.narrow(0, 1, kCodes - 1)) / 2;
}

std::pair<at::Tensor, at::Tensor> quantize_blockwise(const at::Tensor& x, const at::Tensor& code, int64_t block) {
  TORCH_CHECK(x.device().is_cpu() && x.scalar_type() == at::kFloat, "quantize_blockwise takes a float32 CPU tensor");
  at::Tensor in = x.contiguous();
  const int64_t n = in.numel(), blocks = (n + block - 1) / block;
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kByte));
  at::Tensor absmax = at::empty({blocks}, in.options());
  at::Tensor mids = midpoints(code.contiguous());
  const float* src = in.data_ptr<float>();
  const float* mp = mids.data_ptr<float>();
  uint8_t* dst = out.data_ptr<uint8_t>();
  float* am = absmax.data_ptr<float>();
  at::parallel_for(0, blocks, 16, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * block, end = std::min(n, begin + block);
      const BlockScale scale = block_scale(src + begin, end - begin, block);
      am[b] = scale.absmax;
      for (int64_t i = begin; i < end; ++i) dst[i] = static_cast<uint8_t>(nearest_code(mp, scale(src[i])));
    }
  });
  return {out, absmax};
}

at::Tensor dequantize_blockwise(const at::Tensor& codes, const at::Tensor& absmax, const at::Tensor& code,
                                int64_t block) {
  TORCH_CHECK(codes.scalar_type() == at::kByte, "codes must be uint8");
  const int64_t n = codes.numel();
  at::Tensor values = code.index_select(0, codes.reshape({-1}).to(at::kLong));
  at::Tensor scale = absmax.repeat_interleave(block).narrow(0, 0, n);
  return (values * scale).view(codes.sizes());
}

}  // namespace ptrain::q8
