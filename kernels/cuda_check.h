// One check for every CUDA runtime call and kernel launch in kernels/: on failure it throws
// std::runtime_error naming the call, file:line and CUDA's own error string.
//   PTRAIN_CUDA_CHECK(cudaMemcpyToSymbol(...));
//   my_kernel<<<grid, block, 0, stream>>>(...); PTRAIN_CUDA_CHECK(cudaGetLastError());
#pragma once
#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace ptrain::kernels {
[[noreturn]] inline void cuda_fail(cudaError_t err, const char* call, const char* file, int line) {
  throw std::runtime_error(std::string(call) + " failed at " + file + ":" + std::to_string(line) + ": " +
                           cudaGetErrorString(err));
}
}  // namespace ptrain::kernels

#define PTRAIN_CUDA_CHECK(call)                                                                                     \
  do {                                                                                                              \
    const cudaError_t ptrain_cuda_err_ = (call);                                                                    \
    if (ptrain_cuda_err_ != cudaSuccess) ::ptrain::kernels::cuda_fail(ptrain_cuda_err_, #call, __FILE__, __LINE__); \
  } while (0)
