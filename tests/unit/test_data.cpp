// Token files, splits and deterministic sampling.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <set>

#include "common/error.h"
#include "data/dataset.h"
#include "data/token_file.h"
#include "test_util.h"

using namespace ptrain;

TEST(TokenFile, RoundTripBothWidths) {
  test::TempDir dir;
  std::vector<uint32_t> ids{0, 1, 255, 65535, 7};
  write_token_file(dir / "a.bin", ids, 65536, 2);
  std::vector<uint32_t> big{0, 70000, 128255};
  write_token_file(dir / "b.bin", big, 128256, 4);
  TokenData a(dir / "a.bin", "tokens"), b(dir / "b.bin", "tokens");
  std::vector<int64_t> got(5);
  a.read(0, 5, got.data());
  EXPECT_EQ(got, (std::vector<int64_t>{0, 1, 255, 65535, 7}));
  b.read(1, 2, got.data());
  EXPECT_EQ(got[0], 70000);
  EXPECT_EQ(got[1], 128255);
  EXPECT_EQ(b.vocab_size(), 128256u);
}

TEST(TokenFile, RejectsCorruptFiles) {
  test::TempDir dir;
  write_token_file(dir / "ok.bin", {1, 2, 3, 4}, 256, 2);
  std::ifstream in(dir / "ok.bin", std::ios::binary);
  std::string bytes((std::istreambuf_iterator<char>(in)), {});
  auto rejected = [&](const std::string& content, const std::string& why) {
    test::write_text(dir / "bad.bin", content);
    try {
      read_token_header(dir / "bad.bin");
      ADD_FAILURE() << "accepted (" << why << ")";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(why), std::string::npos) << e.what();
    }
  };
  rejected(bytes.substr(0, 10), "shorter than its 32-byte header");
  rejected(bytes.substr(0, bytes.size() - 1), "truncated or corrupt");
  rejected(bytes + "xx", "truncated or corrupt");
  rejected("NOTATOKN" + bytes.substr(8), "bad magic");
  std::string wide = bytes;
  wide[12] = 3;
  rejected(wide, "token width 3");
  EXPECT_THROW(write_token_file(dir / "c.bin", {300}, 256, 2), UsageError);
}

TEST(TextData, BytesAreTokens) {
  test::TempDir dir;
  test::write_text(dir / "t.txt", "AB\xff");
  TokenData d(dir / "t.txt", "text");
  std::vector<int64_t> got(3);
  d.read(0, 3, got.data());
  EXPECT_EQ(got, (std::vector<int64_t>{65, 66, 255}));
  EXPECT_THROW(d.read(2, 5, got.data()), c10::Error);
}

TEST(Sampler, EachEpochVisitsEveryWindowOnceInASeededOrder) {
  test::TempDir dir;
  test::write_text(dir / "t.txt", test::synthetic_corpus(10001));
  TokenData d(dir / "t.txt", "text");
  Split train = train_split(d, 0.1, 100);
  Split val = val_split(d, 0.1, 100);
  EXPECT_EQ(train.end, val.begin);
  EXPECT_EQ(val.end, d.size());
  EXPECT_EQ(val.size(), 1000);
  WindowSampler s(train, 100, 42), again(train, 100, 42), other(train, 100, 43);
  const int64_t n = s.windows_per_epoch();
  EXPECT_EQ(n, (train.size() - 1) / 100);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen;
    for (int64_t k = 0; k < n; ++k) {
      const int64_t start = s.window_start(epoch * n + k);
      EXPECT_EQ(start % 100, 0);
      EXPECT_LE(start + 101, train.end);
      seen.insert(start);
    }
    EXPECT_EQ(static_cast<int64_t>(seen.size()), n);
  }
  int differs = 0;
  for (int64_t k = 0; k < n; ++k) {
    EXPECT_EQ(s.window_start(k), again.window_start(k));  // same seed, same order (and random access)
    differs += s.window_start(k) != other.window_start(k);
    differs += s.window_start(k) != s.window_start(k + n);  // epochs reshuffle
  }
  EXPECT_GT(differs, n);
}
