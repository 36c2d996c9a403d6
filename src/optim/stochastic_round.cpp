#include "optim/stochastic_round.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <cstring>

#include "optim/sr_bits.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>

#include "stochastic_round_cuda.h"
#endif

namespace ptrain {

at::Tensor stochastic_round_bf16(const at::Tensor& x, uint64_t seed, uint64_t offset) {
  TORCH_CHECK(x.scalar_type() == at::kFloat, "stochastic_round_bf16 takes float32, got ", x.scalar_type());
  at::Tensor in = x.contiguous();
  at::Tensor out = at::empty(in.sizes(), in.options().dtype(at::kBFloat16));
  const int64_t n = in.numel();
  const float* src = in.data_ptr<float>();
  auto* dst = reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>());
  if (in.is_cuda()) {
#ifdef PTRAIN_CUDA
    kernels::stochastic_round_bf16(src, dst, n, seed, offset,
                                   at::cuda::getCurrentCUDAStream(in.device().index()).stream());
    return out;
#else
    TORCH_CHECK(false, "stochastic_round_bf16 on CUDA needs a build with nvcc");
#endif
  }
  at::parallel_for(0, n, 1 << 14, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) {
      uint32_t bits;
      std::memcpy(&bits, src + i, 4);
      dst[i] = sr::round_bits(bits, sr::hash(seed, offset + static_cast<uint64_t>(i)));
    }
  });
  return out;
}

}  // namespace ptrain
