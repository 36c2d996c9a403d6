#include "quant/ggml_quants.h"

#include <c10/util/Exception.h>
#include <c10/util/Half.h>

#include <cstring>

#include "common/error.h"
#include "quant/ggml_grids.h"

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
    {GgmlType::iq2_xxs, "IQ2_XXS", kQKK, 2 + kQKK / 4},
    {GgmlType::iq2_xs, "IQ2_XS", kQKK, 2 + kQKK / 4 + kQKK / 32},
    {GgmlType::iq2_s, "IQ2_S", kQKK, 2 + kQKK / 4 + kQKK / 32 + kQKK / 32},
    {GgmlType::iq3_xxs, "IQ3_XXS", kQKK, 2 + 3 * kQKK / 8},
    {GgmlType::iq3_s, "IQ3_S", kQKK, 2 + kQKK / 4 + kQKK / 32 + kQKK / 8 + kQKK / 64},
    {GgmlType::iq1_s, "IQ1_S", kQKK, 2 + kQKK / 8 + kQKK / 16},
    {GgmlType::iq1_m, "IQ1_M", kQKK, kQKK / 8 + kQKK / 16 + kQKK / 32},
    {GgmlType::iq4_nl, "IQ4_NL", kQK, 2 + kQK / 2},
    {GgmlType::iq4_xs, "IQ4_XS", kQKK, 2 + 2 + kQKK / 64 + kQKK / 2},
    {GgmlType::tq1_0, "TQ1_0", kQKK, (kQKK - 4 * kQKK / 64) / 5 + kQKK / 64 + 2},
    {GgmlType::tq2_0, "TQ2_0", kQKK, kQKK / 4 + 2},
    {GgmlType::mxfp4, "MXFP4", kQK, 1 + kQK / 2},
    {GgmlType::nvfp4, "NVFP4", 64, 4 + 32},
};

using namespace ggml_grids;  // NOLINT(google-build-using-namespace): the tables, named as ggml names them

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

// The i-quants' sign bytes: 7 stored bits and an eighth that makes the count of set bits even
// (ggml's ksigns_iq2xs); a set bit negates its element.
uint8_t ksigns(uint32_t seven) {
  const uint32_t s = seven & 0x7F;
  return static_cast<uint8_t>(s | ((__builtin_popcount(s) & 1u) << 7));
}
float sign_of(uint8_t signs, int j) { return (signs >> j) & 1 ? -1.0f : 1.0f; }

// Element i of codebook point `word` (ggml_grids.h).
template <size_t N>
float level(const float (&levels)[N], int bits, uint16_t word, int i) {
  return levels[(word >> (bits * i)) & ((1 << bits) - 1)];
}

// IQ2_XXS: 8 groups of 32; each a uint32 of four grid indices (byte l: 8 elements) and a uint32
// of four 7-bit sign indices and a 4-bit scale; y = d * (0.5 + scale) * 0.25 * point * sign.
void iq2_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int g = 0; g < 8; ++g) {
    const uint32_t points = u32_at(b + 2 + 8 * g), aux = u32_at(b + 2 + 8 * g + 4);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.25f;
    for (int l = 0; l < 4; ++l) {
      const uint16_t w = kIq2xxsGrid[(points >> (8 * l)) & 0xFF];
      const uint8_t s = ksigns(aux >> (7 * l));
      for (int j = 0; j < 8; ++j) y[g * 32 + l * 8 + j] = db * level(kIq2xxsLevels, kIq2xxsBits, w, j) * sign_of(s, j);
    }
  }
}

// IQ2_XS / IQ2_S: the scale of grid point k (of 32) — 4 bits per two points, two to a byte —
// d * (0.5 + scale) * 0.25.
float iq2_scale(float d, const uint8_t* scales, int k) {
  const int sc = (scales[k / 4] >> (4 * (k / 2 % 2))) & 0x0F;
  return d * (0.5f + static_cast<float>(sc)) * 0.25f;
}

// IQ2_XS: 32 uint16 (a 9-bit grid index, a 7-bit sign index) and 16 4-bit scales, one per 16 elements.
void iq2_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* scales = b + 2 + kQKK / 4;
  for (int k = 0; k < kQKK / 8; ++k) {
    uint16_t q;
    std::memcpy(&q, b + 2 + 2 * k, 2);
    const float db = iq2_scale(d, scales, k);
    const uint16_t w = kIq2xsGrid[q & 511];
    const uint8_t s = ksigns(q >> 9);
    for (int j = 0; j < 8; ++j) y[k * 8 + j] = db * level(kIq2xsLevels, kIq2xsBits, w, j) * sign_of(s, j);
  }
}

// IQ2_S: 32 grid indices of 10 bits (a byte and 2 bits of qh), 32 sign bytes as they are, 16
// 4-bit scales.
void iq2_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* signs = qs + kQKK / 8;
  const uint8_t* qh = signs + kQKK / 8;
  const uint8_t* scales = qh + kQKK / 32;
  for (int k = 0; k < kQKK / 8; ++k) {
    const float db = iq2_scale(d, scales, k);
    const uint16_t w = kIq2sGrid[qs[k] | (((qh[k / 4] >> (2 * (k % 4))) & 3) << 8)];
    for (int j = 0; j < 8; ++j) y[k * 8 + j] = db * level(kIq2sLevels, kIq2sBits, w, j) * sign_of(signs[k], j);
  }
}

// IQ3_XXS: 64 grid indices (4 elements each), then per group of 32 a uint32 of four 7-bit sign
// indices and a 4-bit scale; y = d * (0.5 + scale) * 0.5 * point * sign.
void iq3_xxs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int g = 0; g < 8; ++g) {
    const uint32_t aux = u32_at(b + 2 + kQKK / 4 + 4 * g);
    const float db = d * (0.5f + static_cast<float>(aux >> 28)) * 0.5f;
    for (int e = 0; e < 32; ++e) {
      const uint16_t w = kIq3xxsGrid[qs[g * 8 + e / 4]];
      y[g * 32 + e] = db * level(kIq3xxsLevels, kIq3xxsBits, w, e % 4) * sign_of(ksigns(aux >> (7 * (e / 8))), e % 8);
    }
  }
}

// IQ3_S: 64 grid indices of 9 bits (a byte and a bit of qh), 32 sign bytes, 8 4-bit scales;
// y = d * (1 + 2 * scale) * point * sign.
void iq3_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  const uint8_t* qh = qs + kQKK / 4;
  const uint8_t* signs = qh + kQKK / 32;
  const uint8_t* scales = signs + kQKK / 8;
  for (int e = 0; e < kQKK; ++e) {
    const int k = e / 4;
    const int sc = (scales[e / 64] >> (4 * (e / 32 % 2))) & 0x0F;
    const float db = d * static_cast<float>(1 + 2 * sc);
    const uint16_t w = kIq3sGrid[qs[k] | (((qh[k / 8] >> (k % 8)) & 1) << 8)];
    y[e] = db * level(kIq3sLevels, kIq3sBits, w, e % 4) * sign_of(signs[e / 8], e % 8);
  }
}

// IQ1_S / IQ1_M: points of -1, 0, 1 (11-bit indices), each shifted by a delta of +-1/8 and scaled:
// y = dl * (point + delta). IQ1_S: per group of 32 a uint16 holding four 3-bit index tops, a
// 3-bit scale (dl = d * (2 * scale + 1)) and the delta's sign; IQ1_M: per pair of points a
// nibble (3 index bits, the delta's sign), 3-bit scales per 16 elements, and the float16 d spread
// over the scale words' top nibbles.
constexpr float kIq1Delta = 0.125f;
void iq1_s(const uint8_t* b, float* y) {
  const float d = half_at(b);
  const uint8_t* qs = b + 2;
  for (int k = 0; k < kQKK / 8; ++k) {
    uint16_t qh;
    std::memcpy(&qh, b + 2 + kQKK / 8 + 2 * (k / 4), 2);
    const float dl = d * static_cast<float>(2 * ((qh >> 12) & 7) + 1);
    const float delta = (qh & 0x8000) == 0 ? kIq1Delta : -kIq1Delta;
    const uint16_t w = kIq1sGrid[qs[k] | (((qh >> (3 * (k % 4))) & 7) << 8)];
    for (int j = 0; j < 8; ++j) y[k * 8 + j] = dl * (level(kIq1sLevels, kIq1sBits, w, j) + delta);
  }
}

void iq1_m(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + kQKK / 8;
  uint16_t sc[4];
  std::memcpy(sc, b + kQKK / 8 + kQKK / 16, 8);
  const uint16_t bits = static_cast<uint16_t>(((sc[0] & 0xF000) >> 12) | ((sc[1] & 0xF000) >> 8) |
                                              ((sc[2] & 0xF000) >> 4) | (sc[3] & 0xF000));
  const float d = c10::detail::fp16_ieee_to_fp32_value(bits);
  for (int k = 0; k < kQKK / 8; ++k) {
    const int s = k / 2;  // the 3-bit scale of these 16 elements
    const float dl = d * static_cast<float>(2 * ((sc[s / 4] >> (3 * (s % 4))) & 7) + 1);
    const int nibble = (qh[k / 2] >> (4 * (k % 2))) & 0x0F;
    const float delta = (nibble & 8) == 0 ? kIq1Delta : -kIq1Delta;
    const uint16_t w = kIq1sGrid[qs[k] | ((nibble & 7) << 8)];
    for (int j = 0; j < 8; ++j) y[k * 8 + j] = dl * (level(kIq1sLevels, kIq1sBits, w, j) + delta);
  }
}

// IQ4_NL / IQ4_XS's 16 levels, a non-linear 4-bit scale (ggml's kvalues_iq4nl).
constexpr int8_t kIq4Levels[16] = {-127, -104, -83, -65, -49, -35, -22, -10, 1, 13, 25, 38, 53, 69, 89, 113};

// IQ4_NL: blocks of 32 as Q4_0 lays them out, each nibble a level: y = d * level.
void iq4_nl(const uint8_t* b, float* y) {
  const float d = half_at(b);
  for (int m = 0; m < kQK / 2; ++m) {
    y[m] = d * static_cast<float>(kIq4Levels[b[2 + m] & 0x0F]);
    y[m + kQK / 2] = d * static_cast<float>(kIq4Levels[b[2 + m] >> 4]);
  }
}

// IQ4_XS: 8 groups of 32, each IQ4_NL's layout with a 6-bit scale (low 4 bits in scales_l, high 2
// in the uint16 scales_h) minus 32: y = (d * scale) * level.
void iq4_xs(const uint8_t* b, float* y) {
  const float d = half_at(b);
  uint16_t high;
  std::memcpy(&high, b + 2, 2);
  const uint8_t* low = b + 4;
  const uint8_t* qs = b + 4 + kQKK / 64;
  for (int g = 0; g < 8; ++g) {
    const int scale = (((low[g / 2] >> (4 * (g % 2))) & 0x0F) | (((high >> (2 * g)) & 3) << 4)) - 32;
    const float dl = d * static_cast<float>(scale);
    for (int m = 0; m < 16; ++m) {
      y[g * 32 + m] = dl * static_cast<float>(kIq4Levels[qs[g * 16 + m] & 0x0F]);
      y[g * 32 + 16 + m] = dl * static_cast<float>(kIq4Levels[qs[g * 16 + m] >> 4]);
    }
  }
}

// TQ1_0: ternary digits packed five to a byte (four in qh) as a fixed-point fraction of 3^5: digit n
// of byte q is ((uint8)(q * 3^n) * 3) >> 8; y = d * (digit - 1). Elements: 32 bytes x 5 digits,
// 16 bytes x 5, then qh's 4 bytes x 4, digit-major.
void tq1_0(const uint8_t* b, float* y) {
  const uint8_t* qs = b;
  const uint8_t* qh = b + (kQKK - 4 * kQKK / 64) / 5;
  const float d = half_at(qh + kQKK / 64);
  static constexpr uint8_t kPow3[5] = {1, 3, 9, 27, 81};
  const auto digit = [](uint8_t q, int n) {
    const auto shifted = static_cast<uint8_t>(q * kPow3[n]);
    return static_cast<float>(static_cast<int>((static_cast<uint16_t>(shifted) * 3) >> 8) - 1);
  };
  int e = 0;
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 32; ++m) y[e++] = d * digit(qs[m], n);
  for (int n = 0; n < 5; ++n)
    for (int m = 0; m < 16; ++m) y[e++] = d * digit(qs[32 + m], n);
  for (int n = 0; n < 4; ++n)
    for (int m = 0; m < 4; ++m) y[e++] = d * digit(qh[m], n);
}

// TQ2_0: 2-bit digits, element j * 128 + l * 32 + m from bits 2l of qs[j * 32 + m]; y = d * (q - 1).
void tq2_0(const uint8_t* b, float* y) {
  const float d = half_at(b + kQKK / 4);
  for (int e = 0; e < kQKK; ++e) {
    const int q = (b[e / 128 * 32 + e % 32] >> (2 * (e / 32 % 4))) & 3;
    y[e] = d * static_cast<float>(q - 1);
  }
}

// MXFP4 / NVFP4's 4-bit floats (E2M1), doubled: the scales carry the half.
constexpr int8_t kFp4Doubled[16] = {0, 1, 2, 3, 4, 6, 8, 12, 0, -1, -2, -3, -4, -6, -8, -12};

float bits_float(uint32_t bits) {
  float f;
  std::memcpy(&f, &bits, 4);
  return f;
}

// MXFP4: an E8M0 scale (half of 2^(e - 127)) and 32 E2M1 nibbles, low nibbles first.
void mxfp4(const uint8_t* b, float* y) {
  const uint32_t e = b[0];
  const float d = bits_float(e < 2 ? 0x00200000u << e : (e - 1) << 23);
  for (int m = 0; m < kQK / 2; ++m) {
    y[m] = d * static_cast<float>(kFp4Doubled[b[1 + m] & 0x0F]);
    y[m + kQK / 2] = d * static_cast<float>(kFp4Doubled[b[1 + m] >> 4]);
  }
}

// NVFP4: four sub-blocks of 16, each with an unsigned E4M3 scale (halved; 0 and 0x7F read as 0)
// and 8 bytes of E2M1 nibbles, low nibbles first.
void nvfp4(const uint8_t* b, float* y) {
  for (int s = 0; s < 4; ++s) {
    const uint8_t x = b[s];
    const int exp = (x >> 3) & 0x0F, man = x & 7;
    const float raw = exp == 0 ? std::ldexp(static_cast<float>(man), -9)
                               : (1.0f + static_cast<float>(man) / 8.0f) * std::ldexp(1.0f, exp - 7);
    const float d = x == 0 || x == 0x7F ? 0.0f : raw * 0.5f;
    for (int m = 0; m < 8; ++m) {
      const uint8_t q = b[4 + s * 8 + m];
      y[s * 16 + m] = d * static_cast<float>(kFp4Doubled[q & 0x0F]);
      y[s * 16 + 8 + m] = d * static_cast<float>(kFp4Doubled[q >> 4]);
    }
  }
}

}  // namespace

const char* const kGgmlTypesRead =
    "it reads what gguf-py dequantizes for transformers' GGUF loader: F32, F16, BF16, Q4_0, Q4_1, Q5_0, Q5_1, "
    "Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K, IQ1_S, IQ1_M, IQ2_XXS, IQ2_XS, IQ2_S, IQ3_XXS, IQ3_S, IQ4_NL, IQ4_XS, "
    "TQ1_0, TQ2_0, MXFP4, NVFP4";

const GgmlTypeInfo* ggml_type_info(uint32_t type) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == type) return &t;
  return nullptr;
}

std::string ggml_any_type_name(uint32_t type) {
  // ggml.h's enum ggml_type (ids 4, 5, 31-33, 36-38 are retired or unassigned).
  static const char* const kNames[] = {
      "F32",   "F16",    "Q4_0",  "Q4_1",  nullptr, nullptr,   "Q5_0",   "Q5_1",    "Q8_0",  "Q8_1",   "Q2_K",
      "Q3_K",  "Q4_K",   "Q5_K",  "Q6_K",  "Q8_K",  "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S", "IQ4_NL", "IQ3_S",
      "IQ2_S", "IQ4_XS", "I8",    "I16",   "I32",   "I64",     "F64",    "IQ1_M",   "BF16",  nullptr,  nullptr,
      nullptr, "TQ1_0",  "TQ2_0", nullptr, nullptr, nullptr,   "MXFP4",  "NVFP4",   "Q1_0"};
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
      case GgmlType::iq2_xxs:
        iq2_xxs(b, y);
        break;
      case GgmlType::iq2_xs:
        iq2_xs(b, y);
        break;
      case GgmlType::iq2_s:
        iq2_s(b, y);
        break;
      case GgmlType::iq3_xxs:
        iq3_xxs(b, y);
        break;
      case GgmlType::iq3_s:
        iq3_s(b, y);
        break;
      case GgmlType::iq1_s:
        iq1_s(b, y);
        break;
      case GgmlType::iq1_m:
        iq1_m(b, y);
        break;
      case GgmlType::iq4_nl:
        iq4_nl(b, y);
        break;
      case GgmlType::iq4_xs:
        iq4_xs(b, y);
        break;
      case GgmlType::tq1_0:
        tq1_0(b, y);
        break;
      case GgmlType::tq2_0:
        tq2_0(b, y);
        break;
      case GgmlType::mxfp4:
        mxfp4(b, y);
        break;
      case GgmlType::nvfp4:
        nvfp4(b, y);
        break;
    }
  }
}

}  // namespace ptrain
