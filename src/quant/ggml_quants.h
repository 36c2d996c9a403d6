// ggml's tensor types (the `type` of a GGUF tensor) and their block formats: what a GGUF file's
// bytes mean. ptrain writes F32 / F16 / BF16 / Q8_0 (checkpoint/gguf.h) and reads those plus every
// block type gguf-py dequantizes (and so transformers' GGUF loader): the legacy 4/5-bit blocks
// (Q4_0, Q4_1, Q5_0, Q5_1), the K-quants (Q2_K ... Q6_K) of llama.cpp's usual releases (Q4_K_M
// mixes Q4_K and Q6_K, for example), the i-quants (IQ1_S ... IQ4_XS: codebooks of points,
// src/quant/ggml_grids.h, IQ4_XS / IQ4_NL a 16-level non-linear scale), the ternary TQ1_0 / TQ2_0
// and the 4-bit floats MXFP4 / NVFP4. Dequantization is ggml's reference arithmetic
// (ggml-quants.c's dequantize_row_*), in float32 with each product and sum rounded on its own, in
// gguf-py's order — what its numpy dequantize computes, bit for bit.
#pragma once
#include <cstdint>
#include <string>

namespace ptrain {

// ggml_type values, as the file stores them (those ptrain knows by name; others are refused by
// their number).
enum class GgmlType : uint32_t {
  f32 = 0,
  f16 = 1,
  q4_0 = 2,
  q4_1 = 3,
  q5_0 = 6,
  q5_1 = 7,
  q8_0 = 8,
  q2_k = 10,
  q3_k = 11,
  q4_k = 12,
  q5_k = 13,
  q6_k = 14,
  iq2_xxs = 16,
  iq2_xs = 17,
  iq3_xxs = 18,
  iq1_s = 19,
  iq4_nl = 20,
  iq3_s = 21,
  iq2_s = 22,
  iq4_xs = 23,
  iq1_m = 29,
  bf16 = 30,
  tq1_0 = 34,
  tq2_0 = 35,
  mxfp4 = 39,
  nvfp4 = 40,
};

// A type's name as ggml spells it ("Q4_K"), its elements per block and bytes per block; null
// for a type id ptrain does not read (Q8_1 and Q8_K, ggml's dot-product intermediates, which gguf-py
// does not dequantize either; F64 and the integer types, which hold no model's weights).
struct GgmlTypeInfo {
  GgmlType type;
  const char* name;
  int64_t block;        // elements per block
  int64_t block_bytes;  // bytes per block
};
const GgmlTypeInfo* ggml_type_info(uint32_t type);
// The types ptrain reads, for messages: "it reads F32, F16, ...".
extern const char* const kGgmlTypesRead;
// ggml's name of any type id it defines, read or not ("IQ4_XS"); "type N" for another id.
std::string ggml_any_type_name(uint32_t type);
const char* ggml_type_name(GgmlType t);
// Bytes of n elements of type t (n a multiple of the block size).
int64_t ggml_type_bytes(GgmlType t, int64_t n);

// n elements (a multiple of t's block) of type t at `src` as float32 into `dst`.
void ggml_dequantize(GgmlType t, const uint8_t* src, int64_t n, float* dst);

}  // namespace ptrain
