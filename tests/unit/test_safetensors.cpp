// The safetensors reader against files written by the reference library (fixture), its own
// writer, and malformed files: every one must raise RuntimeError, never crash or read out of
// bounds (also run under AddressSanitizer by the ptrain_asan_tests target).
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <cstring>

#include "checkpoint/safetensors.h"
#include "common/error.h"
#include "test_util.h"

using namespace ptrain;

TEST(Safetensors, ReadsReferenceWriterDtypes) {
  SafetensorsFile f(test::fixture("dtypes.safetensors"));
  at::Tensor x = f.tensor("x_f32");
  EXPECT_TRUE(at::equal(f.tensor("x_bf16").to(at::kFloat), x));
  EXPECT_TRUE(at::equal(f.tensor("x_f16").to(at::kFloat), x));
  EXPECT_EQ(f.tensor("x_bf16").scalar_type(), at::kBFloat16);
  EXPECT_TRUE(at::equal(f.tensor("m_f32"), at::arange(12, at::kFloat).view({3, 4})));
}

TEST(Safetensors, RoundTrip) {
  test::TempDir dir;
  at::Tensor a = at::randn({3, 5}), b = at::arange(7, at::kLong), c = at::randn({4}).to(at::kBFloat16);
  write_safetensors(dir / "x.safetensors", {{"a", a}, {"b", b}, {"c", c}}, {{"k", "v"}});
  SafetensorsFile f(dir / "x.safetensors");
  EXPECT_TRUE(at::equal(f.tensor("a"), a));
  EXPECT_TRUE(at::equal(f.tensor("b"), b));
  EXPECT_TRUE(at::equal(f.tensor("c"), c));
  EXPECT_EQ(f.metadata().at("k"), "v");
  EXPECT_THROW(f.tensor("missing"), RuntimeError);
}

namespace {
std::string file_with_header(const std::string& json, size_t data_bytes, int64_t claimed_len = -1) {
  std::string out(8, '\0');
  const uint64_t n = claimed_len >= 0 ? static_cast<uint64_t>(claimed_len) : json.size();
  std::memcpy(out.data(), &n, 8);
  return out + json + std::string(data_bytes, '\x01');
}

void expect_rejected(const std::string& bytes, const std::string& why_contains) {
  test::TempDir dir;
  test::write_text(dir / "bad.safetensors", bytes);
  try {
    SafetensorsFile f(dir / "bad.safetensors");
    ADD_FAILURE() << "accepted a malformed file (expected: " << why_contains << ")";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find(why_contains), std::string::npos) << e.what();
  }
}
}  // namespace

TEST(SafetensorsMalformed, TruncatedFiles) {
  test::TempDir dir;
  write_safetensors(dir / "ok.safetensors", {{"a", at::randn({16})}});
  std::string good = test::synthetic_corpus(0);
  {
    std::ifstream in(dir / "ok.safetensors", std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(in), {});
  }
  expect_rejected("", "truncated");
  expect_rejected(good.substr(0, 5), "truncated");
  expect_rejected(good.substr(0, 20), "truncated");                   // header cut
  expect_rejected(good.substr(0, good.size() - 4), "out of bounds");  // data cut: offsets past the end
}

TEST(SafetensorsMalformed, AbsurdHeaderLength) {
  expect_rejected(file_with_header("{}", 0, int64_t{1} << 40), "100 MiB");
  expect_rejected(file_with_header("{}", 0, 1000), "truncated");
}

TEST(SafetensorsMalformed, BadJson) {
  expect_rejected(file_with_header("{\"a\": ", 0), "JSON");
  expect_rejected(file_with_header("[1, 2]", 0), "not a JSON object");
}

TEST(SafetensorsMalformed, OffsetsOutOfBounds) {
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 8), "out of bounds");
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", 8), "out of bounds");
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,-4]}})", 8), "non-negative");
}

TEST(SafetensorsMalformed, OverlapsHolesAndSizeMismatch) {
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                                   R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                                   12),
                  "overlaps");
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), "hole");
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", 8), "do not match");
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]}})", 12), "trailing");
}

TEST(SafetensorsMalformed, BadEntries) {
  expect_rejected(file_with_header(R"({"a":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}})", 1), "unsupported dtype");
  expect_rejected(file_with_header(R"({"a":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), "shape");
  expect_rejected(
      file_with_header(R"({"a":{"dtype":"F32","shape":[4294967296,4294967296,16],"data_offsets":[0,4]}})", 4),
      "overflow");
  expect_rejected(file_with_header(R"({"a":{"shape":[1],"data_offsets":[0,4]}})", 4), "lacks");
  expect_rejected(file_with_header(R"({"__metadata__":{"k":1}})", 0), "__metadata__");
}
