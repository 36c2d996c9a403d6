// NF4 (4-bit NormalFloat) weights as bitsandbytes stores them: blocks of 64 consecutive values
// of the row-major flattened weight, a float32 absmax per block, the nearest of 16 codes
// (float32 midpoint thresholds, a value on a midpoint taking the lower code), two codes per
// byte with element 2j in the high nibble. Double quantization stores the absmax values as
// 8-bit codes of the signed dynamic map (blocks of 256, one float32 absmax each) after
// subtracting their mean. Bit-identical to bitsandbytes 0.50.2 (tests/unit/test_nf4.cpp).
// 4.5 bits per weight, 4.127 with double quantization.
#pragma once
#include <ATen/Tensor.h>

#include <cstdint>
#include <vector>

namespace ptrain::nf4 {

struct Quantized {
  std::vector<int64_t> shape;
  int64_t numel = 0;
  at::Tensor packed;  // uint8 [ceil(numel / 2)]
  at::Tensor absmax;  // float32 [blocks], or uint8 codes [blocks] with double quantization
  bool double_quant = false;
  at::Tensor absmax2;     // float32 [ceil(blocks / 256)] (double quantization)
  float offset = 0.0f;    // mean of the absmax values (double quantization)
  int64_t bytes() const;  // storage actually held
};

// w: float32/bf16/fp16, any device (quantized on the CPU, results on w's device).
Quantized quantize(const at::Tensor& w, bool double_quant);
// A quantized weight as one flat byte buffer — how FSDP shards and all-gathers an NF4 base (4-bit
// bytes on the wire): the packed codes, then the absmax (float32, or uint8 codes), then absmax2
// (float32, double quantization); each part starts at a multiple of kByteAlign bytes.
constexpr int64_t kByteAlign = 16;
struct ByteLayout {
  int64_t packed = 0, absmax = 0, absmax2 = 0;  // offsets of the parts, bytes
  int64_t packed_bytes = 0, absmax_bytes = 0, absmax2_bytes = 0;
  int64_t bytes = 0;  // the whole buffer, a multiple of kByteAlign
};
ByteLayout byte_layout(int64_t numel, bool double_quant);
// q's parts written into `bytes` (uint8 [byte_layout(q.numel, q.double_quant).bytes], zero padding).
void write_bytes(const Quantized& q, const at::Tensor& bytes);
// Points q's tensors at views of `bytes` (laid out as byte_layout says; q.shape, numel,
// double_quant and offset already set): they see whatever the buffer holds when used.
void bind_bytes(Quantized& q, const at::Tensor& bytes);

// Float32 absmax per 64-block (undoes the double quantization).
at::Tensor block_absmax(const Quantized& q);
// The weight in `dtype` on q.packed's device (CUDA: one kernel pass).
at::Tensor dequantize(const Quantized& q, c10::ScalarType dtype);
// The same written into `out` (contiguous, q.numel elements, on q.packed's device, any shape):
// a row block of a larger buffer takes a module's weight without a temporary.
void dequantize_into(const Quantized& q, const at::Tensor& out);

}  // namespace ptrain::nf4
