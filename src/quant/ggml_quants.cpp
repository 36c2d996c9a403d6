#include "quant/ggml_quants.h"

#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstring>

#include "common/error.h"

// Each dequantization below is ggml's dequantize_row_* (ggml-quants.c) in float32: products and
// sums rounded one at a time, in ggml's order — what gguf-py's numpy version computes, bit for bit
// (tests/fixtures/gguf_blocks.py). ptrain builds without FMA instructions, so no product and sum
// are contracted into one rounding.

namespace ptrain {

namespace {

constexpr int64_t kQK = 32;    // the legacy quants' block
constexpr int64_t kQKK = 256;  // the K-quants' super-block

const GgmlTypeInfo kTypes[] = {
    {GgmlType::f32, "F32", 1, 4},
    {GgmlType::f16, "F16", 1, 2},
    {GgmlType::q4_0, "Q4_0", kQK, 2 + kQK / 2},
    {GgmlType::q4_1, "Q4_1", kQK, 4 + kQK / 2},
    {GgmlType::q5_0, "Q5_0", kQK, 2 + 4 + kQK / 2},
    {GgmlType::q5_1, "Q5_1", kQK, 4 + 4 + kQK / 2},
    {GgmlType::q8_0, "Q8_0", kQK, 2 + kQK},
    {GgmlType::q2_k, "Q2_K", kQKK, kQKK / 16 + kQKK / 4 + 2 + 2},
    {GgmlType::q3_k, "Q3_K", kQKK, kQKK / 8 + kQKK / 4 + 12 + 2},
    {GgmlType::q4_k, "Q4_K", kQKK, 2 + 2 + 12 + kQKK / 2},
    {GgmlType::q5_k, "Q5_K", kQKK, 2 + 2 + 12 + kQKK / 8 + kQKK / 2},
    {GgmlType::q6_k, "Q6_K", kQKK, kQKK / 2 + kQKK / 4 + kQKK / 16 + 2},
    {GgmlType::bf16, "BF16", 1, 2},
};

float half_at(const uint8_t* p) {
  uint16_t bits;
  std::memcpy(&bits, p, 2);
  return c10::detail::fp16_ieee_to_fp32_value(bits);
}

uint32_t u32_at(const uint8_t* p) {
  uint32_t v;
  std::memcpy(&v, p, 4);
  return v;
}

// Q4_0 / Q4_1: element j < 16 from qs[j]'s low nibble, j + 16 from its high nibble;
// Q4_0: (q - 8) * d, Q4_1: q * d + m.
void legacy4(const uint8_t* b, float* y, bool has_min) {
  const float d = half_at(b), m = has_min ? half_at(b + 2) : 0.0f;
  const uint8_t* qs = b + (has_min ? 4 : 2);
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = qs[j] & 0x0F, hi = qs[j] >> 4;
    if (has_min) {
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kQK / 2] = static_cast<float>(hi) * d + m;
    } else {
      y[j] = static_cast<float>(lo - 8) * d;
      y[j + kQK / 2] = static_cast<float>(hi - 8) * d;
    }
  }
}

// Q5_0 / Q5_1: a nibble plus bit j of the 32-bit qh as the fifth bit; Q5_0: (q - 16) * d,
// Q5_1: q * d + m.
void legacy5(const uint8_t* b, float* y, bool has_min) {
  const float d = half_at(b), m = has_min ? half_at(b + 2) : 0.0f;
  const uint32_t qh = u32_at(b + (has_min ? 4 : 2));
  const uint8_t* qs = b + (has_min ? 8 : 6);
  for (int j = 0; j < kQK / 2; ++j) {
    const int lo = (qs[j] & 0x0F) | static_cast<int>(((qh >> j) & 1u) << 4);
    const int hi = (qs[j] >> 4) | static_cast<int>(((qh >> (j + 16)) & 1u) << 4);
    if (has_min) {
      y[j] = static_cast<float>(lo) * d + m;
      y[j + kQK / 2] = static_cast<float>(hi) * d + m;
    } else {
      y[j] = static_cast<float>(lo - 16) * d;
      y[j + kQK / 2] = static_cast<float>(hi - 16) * d;
    }
  }
}

void q8_0(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int j = 0; j < kQK; ++j) y[j] = static_cast<float>(static_cast<int8_t>(b[2 + j])) * d;
}

// Q2_K: 16 sub-blocks of 16, each with a 4-bit scale and a 4-bit min; element e (of 256) is the
// 2-bit field (e / 32 % 4) of byte qs[e / 128 * 32 + e % 32].
void q2_k(const uint8_t* b, float* y) {
  const uint8_t* scales = b;
  const uint8_t* qs = b + kQKK / 16;
  const float d = half_at(b + kQKK / 16 + kQKK / 4), dmin = half_at(b + kQKK / 16 + kQKK / 4 + 2);
  for (int e = 0; e < kQKK; ++e) {
    const uint8_t sc = scales[e / 16];
    const float dl = d * static_cast<float>(sc & 0x0F), ml = dmin * static_cast<float>(sc >> 4);
    const int q = (qs[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3;
    y[e] = dl * static_cast<float>(q) - ml;
  }
}

// Q3_K: 16 sub-blocks of 16 with 6-bit signed scales (low 4 bits in bytes 0-7, high 2 in 8-11);
// element e is the 2-bit field as in Q2_K, minus 4 where bit e / 32 of hmask[e % 32] is clear.
void q3_k(const uint8_t* b, float* y) {
  const uint8_t* hmask = b;
  const uint8_t* qs = b + kQKK / 8;
  const uint8_t* packed = b + kQKK / 8 + kQKK / 4;
  const float d = half_at(packed + 12);
  float dl[16];
  for (int i = 0; i < 16; ++i) {
    const int low = (packed[i % 8] >> (4 * (i / 8))) & 0x0F;
    const int high = (packed[8 + i % 4] >> (2 * (i / 4))) & 0x03;
    dl[i] = d * static_cast<float>((low | (high << 4)) - 32);
  }
  for (int e = 0; e < kQKK; ++e) {
    const int low = (qs[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3;
    const int q = low - (((hmask[e % 32] >> (e / 32)) & 1) ? 0 : 4);
    y[e] = dl[e / 16] * static_cast<float>(q);
  }
}

// Q4_K / Q5_K's 8 sub-block scales and mins, 6 bits each in 12 bytes (ggml's get_scale_min_k4).
void scale_min_k4(const uint8_t* s, int j, int& sc, int& m) {
  if (j < 4) {
    sc = s[j] & 63;
    m = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0x0F) | ((s[j - 4] >> 6) << 4);
    m = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// Q4_K / Q5_K: 8 sub-blocks of 32; sub-block 2g + h is byte group g's low (h = 0) or high nibble,
// Q5_K's fifth bit the sub-block's bit of qh[l]; y = (d * sc) * q - dmin * m.
void q45_k(const uint8_t* b, float* y, bool five) {
  const float d = half_at(b), dmin = half_at(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* qs = b + 16 + (five ? kQKK / 8 : 0);
  for (int sub = 0; sub < 8; ++sub) {
    int sc = 0, m = 0;
    scale_min_k4(scales, sub, sc, m);
    const float d1 = d * static_cast<float>(sc), m1 = dmin * static_cast<float>(m);
    const uint8_t* group = qs + sub / 2 * 32;
    for (int l = 0; l < 32; ++l) {
      int q = sub % 2 ? group[l] >> 4 : group[l] & 0x0F;
      if (five) q |= ((qh[l] >> sub) & 1) << 4;
      y[sub * 32 + l] = d1 * static_cast<float>(q) - m1;
    }
  }
}

// Q6_K: 16 sub-blocks of 16 with int8 scales; element g * 128 + k * 32 + l (k < 4, l < 32) takes
// ql[g * 64 + (k % 2) * 32 + l]'s low (k < 2) or high nibble and bits 2k of qh[g * 32 + l].
void q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + kQKK / 2;
  const auto* scales = reinterpret_cast<const int8_t*>(b + kQKK / 2 + kQKK / 4);
  const float d = half_at(b + kQKK / 2 + kQKK / 4 + kQKK / 16);
  for (int e = 0; e < kQKK; ++e) {
    const int g = e / 128, k = e % 128 / 32, l = e % 32;
    const uint8_t low = ql[g * 64 + (k % 2) * 32 + l];
    const int q = ((k < 2 ? low & 0x0F : low >> 4) | (((qh[g * 32 + l] >> (2 * k)) & 3) << 4)) - 32;
    y[e] = d * static_cast<float>(scales[e / 16]) * static_cast<float>(q);
  }
}

}  // namespace

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type) return &t;
  return nullptr;
}

std::string ggml_any_type_name(uint32_t type) {
  // ggml.h's enum ggml_type (ids 4, 5, 31-33, 36-38 are retired or unassigned).
  static const char* const kNames[] = {"F32",     "F16",    "Q4_0",    "Q4_1",  nullptr,  nullptr, "Q5_0",  "Q5_1",
                                       "Q8_0",    "Q8_1",   "Q2_K",    "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",
                                       "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS",
                                       "I8",      "I16",    "I32",     "I64",   "F64",    "IQ1_M", "BF16",  nullptr,
                                       nullptr,   nullptr,  "TQ1_0",   "TQ2_0", nullptr,  nullptr, nullptr, "MXFP4"};
  if (type < sizeof(kNames) / sizeof(kNames[0]) && kNames[type]) return kNames[type];
  return "type " + std::to_string(type);
}

const char* ggml_type_name(GgmlType t) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t));
  return info ? info->name : "?";
}

int64_t ggml_type_bytes(GgmlType t, int64_t n) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t));
  TORCH_CHECK(info && n % info->block == 0, "ggml_type_bytes: ", n, " elements of type ", static_cast<uint32_t>(t));
  return n / info->block * info->block_bytes;
}

void ggml_dequantize(GgmlType t, const uint8_t* src, int64_t n, float* dst) {
  const GgmlTypeInfo* info = ggml_type_info(static_cast<uint32_t>(t));
  TORCH_CHECK(info && n % info->block == 0, "ggml_dequantize: ", n, " elements of type ", static_cast<uint32_t>(t));
  const int64_t blocks = n / info->block;
  for (int64_t i = 0; i < blocks; ++i) {
    const uint8_t* b = src + i * info->block_bytes;
    float* y = dst + i * info->block;
    switch (t) {
      case GgmlType::f32:
        std::memcpy(y, b, 4);
        break;
      case GgmlType::f16:
        *y = half_at(b);
        break;
      case GgmlType::bf16: {
        uint16_t h;
        std::memcpy(&h, b, 2);
        const uint32_t bits = static_cast<uint32_t>(h) << 16;
        std::memcpy(y, &bits, 4);
        break;
      }
      case GgmlType::q4_0:
      case GgmlType::q4_1:
        legacy4(b, y, t == GgmlType::q4_1);
        break;
      case GgmlType::q5_0:
      case GgmlType::q5_1:
        legacy5(b, y, t == GgmlType::q5_1);
        break;
      case GgmlType::q8_0:
        q8_0(b, y);
        break;
      case GgmlType::q2_k:
        q2_k(b, y);
        break;
      case GgmlType::q3_k:
        q3_k(b, y);
        break;
      case GgmlType::q4_k:
      case GgmlType::q5_k:
        q45_k(b, y, t == GgmlType::q5_k);
        break;
      case GgmlType::q6_k:
        q6_k(b, y);
        break;
    }
  }
}

}  // namespace ptrain
