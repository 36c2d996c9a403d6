// The GGUF tokenizer reader's refusals, one file each: what transformers' GGUF loader would build
// differently (other tokenizer models, SentencePiece vocabularies it rebuilds its own way, special
// tokens outside the vocabulary) or cannot build (malformed metadata) is refused naming the key —
// never a tokenizer that half-reads the file. (What it builds is compared with transformers' own
// on llama.cpp's vocabularies by realfiles.compare and sweep.gguf_import.)
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "checkpoint/gguf.h"
#include "common/error.h"
#include "test_util.h"
#include "tokenizer/gguf_tokenizer.h"

using namespace ptrain;

namespace {

// A byte-level BPE vocabulary as llama.cpp's converter writes it: "a", "b", their merge, a
// control token as BOS; `change` replaces keys (a value) or drops them (nullopt).
std::string write_tokenizer(const test::TempDir& dir, const std::string& name,
                            const std::map<std::string, std::optional<GgufValue>>& change = {}) {
  std::vector<std::pair<std::string, GgufValue>> kv{
      {"general.architecture", std::string("llama")},
      {"tokenizer.ggml.model", std::string("gpt2")},
      {"tokenizer.ggml.pre", std::string("llama-bpe")},
      {"tokenizer.ggml.tokens", std::vector<std::string>{"a", "b", "ab", "<|begin|>"}},
      {"tokenizer.ggml.token_type", std::vector<int32_t>{1, 1, 1, 3}},
      {"tokenizer.ggml.merges", std::vector<std::string>{"a b"}},
      {"tokenizer.ggml.bos_token_id", uint32_t{3}},
  };
  GgufWriter w;
  std::set<std::string> written;
  for (auto& [key, value] : kv) {
    const auto c = change.find(key);
    if (c == change.end()) {
      w.add(key, value);
    } else if (c->second) {
      w.add(key, *c->second);
    }
    written.insert(key);
  }
  for (const auto& [key, value] : change)
    if (!written.count(key) && value) w.add(key, *value);
  const std::string path = (dir.path / (name + ".gguf")).string();
  w.write(path);
  return path;
}

void expect_refused(const std::string& path, const std::string& says) {
  try {
    read_gguf_tokenizer(path);
    ADD_FAILURE() << path << " was read; wanted a refusal naming \"" << says << "\"";
  } catch (const UnsupportedInput& e) {
    EXPECT_NE(std::string(e.what()).find(says), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << "the refusal names no file: " << e.what();
  }
}

}  // namespace

TEST(GgufTokenizer, TheBaseFileIsRead) {
  test::TempDir dir;
  const GgufTokenizer t = read_gguf_tokenizer(write_tokenizer(dir, "good"));
  EXPECT_EQ(t.bos, "<|begin|>");
  const auto j = nlohmann::json::parse(t.tokenizer_json);
  EXPECT_EQ(j["model"]["merges"], nlohmann::json::parse(R"([["a", "b"]])"));
  EXPECT_EQ(j["model"]["vocab"].size(), 4u);
}

TEST(GgufTokenizer, EveryRefusalNamesItsKey) {
  test::TempDir dir;
  using V = std::optional<GgufValue>;
  const std::vector<std::tuple<std::string, std::map<std::string, V>, std::string>> cases{
      {"no_model", {{"tokenizer.ggml.model", std::nullopt}}, "no tokenizer.ggml.model"},
      {"t5", {{"tokenizer.ggml.model", std::string("t5")}}, "tokenizer.ggml.model \"t5\""},
      {"bert", {{"tokenizer.ggml.model", std::string("bert")}}, "tokenizer.ggml.model \"bert\""},
      {"gemma_spm",
       {{"general.architecture", std::string("gemma")}, {"tokenizer.ggml.model", std::string("llama")}},
       "a SentencePiece vocabulary of architecture \"gemma\""},
      {"phi3_spm",
       {{"general.architecture", std::string("phi3")}, {"tokenizer.ggml.model", std::string("llama")}},
       "a SentencePiece vocabulary of architecture \"phi3\""},
      {"no_tokens", {{"tokenizer.ggml.tokens", std::vector<std::string>{}}}, "no tokenizer.ggml.tokens"},
      {"types",
       {{"tokenizer.ggml.token_type", std::vector<int32_t>{1, 1, 1}}},
       "tokenizer.ggml.token_type has 3 entries for 4 tokens"},
      {"utf8",
       {{"tokenizer.ggml.tokens", std::vector<std::string>{"a", "b", "ab", "\xff\xfe"}}},
       "tokenizer.ggml.tokens[3] is not valid UTF-8"},
      {"merge",
       {{"tokenizer.ggml.merges", std::vector<std::string>{"a b c"}}},
       "tokenizer.ggml.merges[0] \"a b c\" is not two tokens split by one space"},
      {"no_merges",
       {{"tokenizer.ggml.merges", std::nullopt}},
       "neither tokenizer.ggml.merges nor one tokenizer.ggml.scores entry per token"},
      {"scores_short",
       {{"tokenizer.ggml.merges", std::nullopt}, {"tokenizer.ggml.scores", std::vector<float>{0, -1}}},
       "neither tokenizer.ggml.merges nor one tokenizer.ggml.scores entry per token"},
      {"bos_outside",
       {{"tokenizer.ggml.bos_token_id", uint32_t{9}}},
       "tokenizer.ggml.bos_token_id = 9 is outside the 4 tokens"},
      // A byte-level vocabulary spelling a special token outside GPT-2's byte alphabet (as
      // DeepSeek's llama.cpp vocabularies do): transformers respells the vocabulary and then adds
      // the token as written, past the model's rows.
      {"special_spelled_outside",
       {{"tokenizer.ggml.tokens", std::vector<std::string>{"a", "b", "ab", "<｜begin｜>"}},
        {"tokenizer.ggml.token_type", std::vector<int32_t>{1, 1, 1, 1}}},
       "special token \"<｜begin｜>\" is not in the vocabulary as spelled"},
  };
  for (const auto& [name, change, says] : cases) {
    SCOPED_TRACE(name);
    expect_refused(write_tokenizer(dir, name, change), says);
  }
}

TEST(GgufTokenizer, AGgufFileIsKnownByItsMagicWhateverItsName) {
  test::TempDir dir;
  const std::string gguf = write_tokenizer(dir, "model");
  const std::string renamed = (dir.path / "model.bin").string();
  std::filesystem::rename(gguf, renamed);
  EXPECT_EQ(gguf_tokenizer_file(renamed), renamed);
  const std::string json_file = (dir.path / "tokenizer.json").string();
  std::ofstream(json_file) << "{}";
  EXPECT_EQ(gguf_tokenizer_file(json_file), "") << "a tokenizer.json is no GGUF file";
}

TEST(GgufTokenizer, ADirectoryOfSeveralGgufFilesIsRefused) {
  test::TempDir dir;
  write_tokenizer(dir, "one");
  EXPECT_EQ(gguf_tokenizer_file(dir.path.string()), (dir.path / "one.gguf").string());
  write_tokenizer(dir, "two");
  try {
    gguf_tokenizer_file(dir.path.string());
    ADD_FAILURE() << "a directory of two GGUF files named a tokenizer";
  } catch (const UnsupportedInput& e) {
    EXPECT_NE(std::string(e.what()).find("holds 2 GGUF files and no tokenizer.json"), std::string::npos) << e.what();
  }
}
