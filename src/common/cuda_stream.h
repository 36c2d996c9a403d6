// The current CUDA stream of a tensor's device, as the kernels in kernels/ take it (a
// cudaStream_t passed as void*, so their headers need no CUDA include). CUDA builds only.
#pragma once
#ifdef PTRAIN_CUDA
#include <ATen/Tensor.h>
#include <c10/cuda/CUDAStream.h>

namespace ptrain {

inline void* cuda_stream_of(const at::Tensor& t) {
  return c10::cuda::getCurrentCUDAStream(t.device().index()).stream();
}

}  // namespace ptrain
#endif
