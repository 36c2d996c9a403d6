#include "quant/nf4.h"

#include <ATen/ATen.h>
#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <mutex>
#include <type_traits>

#include "quant/blockwise8.h"
#include "quant/blockwise8_math.h"
#include "quant/nf4_math.h"

#ifdef PTRAIN_CUDA
#include <c10/cuda/CUDAStream.h>

#include "nf4_dequant_cuda.h"
#endif

namespace ptrain::nf4 {

int64_t Quantized::bytes() const {
  int64_t n = packed.nbytes() + absmax.nbytes();
  if (double_quant) n += absmax2.nbytes() + static_cast<int64_t>(sizeof(float));
  return n;
}

Quantized quantize(const at::Tensor& w, bool double_quant) {
  Quantized q;
  q.shape = w.sizes().vec();
  q.numel = w.numel();
  q.double_quant = double_quant;
  at::Tensor x = w.detach().to(at::kCPU, at::kFloat).contiguous().reshape({-1});
  const int64_t n = q.numel, blocks = (n + kBlock - 1) / kBlock;
  at::Tensor packed = at::zeros({(n + 1) / 2}, at::kByte);
  at::Tensor absmax = at::empty({blocks}, at::kFloat);
  float mids[15];
  for (int k = 0; k < 15; ++k) mids[k] = (kCode[k] + kCode[k + 1]) / 2;
  const float* src = x.data_ptr<float>();
  uint8_t* dst = packed.data_ptr<uint8_t>();
  float* am = absmax.data_ptr<float>();
  // Blocks are independent, and a block of 64 (even) starts on a byte boundary.
  at::parallel_for(0, blocks, 64, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) {
      const int64_t begin = b * kBlock, end = std::min(n, begin + kBlock);
      const q8::BlockScale scale = q8::block_scale(src + begin, end - begin, kBlock);
      am[b] = scale.absmax;
      for (int64_t i = begin; i < end; ++i) {
        const int k = q8::nearest_code_counted(mids, scale(src[i]), 16);
        dst[i >> 1] |= static_cast<uint8_t>((i & 1) ? k : k << 4);
      }
      if ((end & 1) && end == n)
        dst[end >> 1] |= static_cast<uint8_t>(q8::nearest_code(mids, 0.0f, 16));  // odd count: pad with 0
    }
  });
  if (double_quant) {
    q.offset = absmax.mean().item<float>();
    auto [codes, absmax2] = q8::quantize_blockwise(absmax - q.offset, q8::dynamic_map(true), kStatsBlock);
    q.absmax = codes;
    q.absmax2 = absmax2;
  } else {
    q.absmax = absmax;
  }
  const auto device = w.device();
  q.packed = packed.to(device);
  q.absmax = q.absmax.to(device);
  if (double_quant) q.absmax2 = q.absmax2.to(device);
  return q;
}

namespace {
int64_t align_up(int64_t n) { return (n + kByteAlign - 1) / kByteAlign * kByteAlign; }
}  // namespace

ByteLayout byte_layout(int64_t numel, bool double_quant) {
  ByteLayout l;
  const int64_t blocks = (numel + kBlock - 1) / kBlock;
  l.packed_bytes = (numel + 1) / 2;
  l.absmax = align_up(l.packed_bytes);
  l.absmax_bytes = double_quant ? blocks : 4 * blocks;
  l.absmax2 = align_up(l.absmax + l.absmax_bytes);
  l.absmax2_bytes = double_quant ? 4 * ((blocks + kStatsBlock - 1) / kStatsBlock) : 0;
  l.bytes = align_up(l.absmax2 + l.absmax2_bytes);
  return l;
}

void write_bytes(const Quantized& q, const at::Tensor& bytes) {
  const ByteLayout l = byte_layout(q.numel, q.double_quant);
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.dim() == 1 && bytes.numel() == l.bytes,
              "NF4 byte buffer: ", l.bytes, " bytes expected");
  bytes.zero_();
  auto put = [&](int64_t at, int64_t n, const at::Tensor& part) {
    if (n > 0) bytes.narrow(0, at, n).copy_(part.contiguous().view(at::kByte).reshape({-1}));
  };
  put(l.packed, l.packed_bytes, q.packed);
  put(l.absmax, l.absmax_bytes, q.absmax);
  if (q.double_quant) put(l.absmax2, l.absmax2_bytes, q.absmax2);
}

void bind_bytes(Quantized& q, const at::Tensor& bytes) {
  const ByteLayout l = byte_layout(q.numel, q.double_quant);
  TORCH_CHECK(bytes.scalar_type() == at::kByte && bytes.numel() == l.bytes, "NF4 byte buffer: ", l.bytes,
              " bytes expected");
  q.packed = bytes.narrow(0, l.packed, l.packed_bytes);
  q.absmax = bytes.narrow(0, l.absmax, l.absmax_bytes);
  if (!q.double_quant) q.absmax = q.absmax.view(at::kFloat);
  q.absmax2 = q.double_quant ? bytes.narrow(0, l.absmax2, l.absmax2_bytes).view(at::kFloat) : at::Tensor();
}

at::Tensor block_absmax(const Quantized& q) {
  if (!q.double_quant) return q.absmax.to(at::kFloat);
  at::Tensor code = q8::dynamic_map(true).to(q.absmax.device());
  return q8::dequantize_blockwise(q.absmax.to(at::kCPU), q.absmax2.to(at::kCPU), code.cpu(), kStatsBlock)
             .to(q.absmax.device()) +
         q.offset;
}

#ifdef PTRAIN_CUDA
namespace {
// The 8-bit signed dynamic map on a GPU, copied there once per device: a copy for each call
// would make every dequantization wait for the device (a pageable host-to-device copy
// synchronizes), hundreds of times a QLoRA step.
const at::Tensor& code8_on(const c10::Device& device) {
  static std::mutex mutex;
  static auto* maps = new std::map<c10::DeviceIndex, at::Tensor>;  // never freed: no release at exit, after CUDA's
  const std::lock_guard<std::mutex> lock(mutex);
  at::Tensor& map = (*maps)[device.index()];
  if (!map.defined()) map = q8::dynamic_map(true).to(device);
  return map;
}
}  // namespace
#endif

void dequantize_into(const Quantized& q, const at::Tensor& out) {
  TORCH_CHECK(out.is_contiguous() && out.numel() == q.numel && out.device() == q.packed.device(),
              "NF4 dequantize_into: a contiguous tensor of ", q.numel, " elements on ", q.packed.device(), " expected");
  const c10::ScalarType dtype = out.scalar_type();
  if (q.packed.is_cuda()) {
#ifdef PTRAIN_CUDA
    TORCH_CHECK(dtype == at::kFloat || dtype == at::kBFloat16, "NF4 dequantizes to float32 or bfloat16 on CUDA");
    const at::Tensor code8 = q.double_quant ? code8_on(q.packed.device()) : at::Tensor();
    kernels::Nf4Dequant k{q.packed.data_ptr<uint8_t>(),
                          q.double_quant ? nullptr : q.absmax.data_ptr<float>(),
                          q.double_quant ? q.absmax.data_ptr<uint8_t>() : nullptr,
                          q.double_quant ? q.absmax2.data_ptr<float>() : nullptr,
                          q.double_quant ? code8.data_ptr<float>() : nullptr,
                          q.offset,
                          q.numel,
                          out.data_ptr(),
                          dtype == at::kBFloat16};
    kernels::nf4_dequantize(k, at::cuda::getCurrentCUDAStream(q.packed.device().index()).stream());
    return;
#else
    TORCH_CHECK(false, "NF4 on CUDA needs a build with nvcc");
#endif
  }
  at::Tensor absmax = block_absmax(q).contiguous();
  const uint8_t* p = q.packed.data_ptr<uint8_t>();
  const float* am = absmax.data_ptr<float>();
  auto fill = [&](auto* dst) {
    using T = std::remove_pointer_t<decltype(dst)>;
    at::parallel_for(0, q.numel, 1 << 14, [&](int64_t i0, int64_t i1) {
      for (int64_t i = i0; i < i1; ++i) dst[i] = static_cast<T>(kCode[nibble(p, i)] * am[i / kBlock]);
    });
  };
  if (dtype == at::kFloat) {
    fill(out.data_ptr<float>());
  } else if (dtype == at::kBFloat16) {
    fill(out.data_ptr<c10::BFloat16>());  // rounded to nearest even, as .to(kBFloat16) rounds
  } else {
    at::Tensor f = at::empty({q.numel}, at::kFloat);
    fill(f.data_ptr<float>());
    out.view({q.numel}).copy_(f);
  }
}

at::Tensor dequantize(const Quantized& q, c10::ScalarType dtype) {
  at::Tensor out = at::empty(q.shape, q.packed.options().dtype(dtype));
  dequantize_into(q, out);
  return out;
}

}  // namespace ptrain::nf4
