// The byte-level BPE tokenizer against HF `tokenizers` (tests/fixtures/make_tokenizer_fixtures.py
// trains one set up as Llama 3's tokenizer.json and saves the ids it gives a varied text set):
// identical ids for every text, and decoding gives the text back exactly. Unsupported
// tokenizer types are refused at load, naming the type. Chats render and mask as transformers'
// apply_chat_template does, with transformers' loss.
#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <filesystem>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "checkpoint/hf.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "data/samples.h"
#include "model/forward.h"
#include "test_util.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

using namespace ptrain;

TEST(Tokenizer, ParityWithHfTokenizers) {
  Tokenizer tok(test::fixture("tokenizer_bpe"));  // the directory, as an HF model directory holds it
  const auto expected = nlohmann::json::parse(read_text_file(test::fixture("tokenizer_bpe_expected.json")));
  const auto& texts = expected.at("texts");
  ASSERT_GE(texts.size(), 20u);
  size_t same = 0, tokens = 0;
  for (size_t i = 0; i < texts.size(); ++i) {
    const std::string text = texts[i].get<std::string>();
    const auto want = expected.at("ids")[i].get<std::vector<int32_t>>();
    const auto got = tok.encode(text);
    EXPECT_EQ(got, want) << "text " << i << ": '" << text << "'";
    same += got == want;
    tokens += want.size();
    EXPECT_EQ(tok.decode(got), text) << "text " << i;
  }
  std::cout << same << " of " << texts.size() << " texts (" << tokens << " tokens) tokenized as HF tokenizers does\n";
  EXPECT_EQ(tok.vocab_size(), 1006);
  EXPECT_EQ(tok.id_of("<|eot_id|>"), tok.encode("<|eot_id|>").at(0));
}

// The tokenizer.json set-ups of the other families (tests/fixtures/make_tokenizer_family_fixtures.py:
// Qwen2's NFC + digit-by-digit regex with lstrip/rstrip/normalized added tokens, Llama 2's and
// Mistral's SentencePiece-style BPE with byte fallback, NFKC + Lowercase + regex Replace under
// GPT-2's regex, NFD + Metaspace splitting with an unknown token; Mistral's set-up again with
// merges that join words and byte tokens, with and without byte fallback, on long texts — where
// ptrain cuts a long piece before BPE): the ids and the decoded text HF `tokenizers` gives, for
// every text.
TEST(Tokenizer, EveryFamilysSetUpMatchesHfTokenizers) {
  const auto expected = nlohmann::json::parse(read_text_file(test::fixture("tokenizer_families_expected.json")));
  ASSERT_EQ(expected.size(), 7u);
  for (const auto& [name, e] : expected.items()) {
    Tokenizer tok(test::fixture("tokenizer_families/" + name));
    const auto& texts = e.at("texts");
    size_t same_ids = 0, same_text = 0, tokens = 0;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto want = e.at("ids")[i].get<std::vector<int32_t>>();
      const auto got = tok.encode(text);
      EXPECT_EQ(got, want) << name << " text " << i << ": '" << text << "'";
      const std::string decoded = tok.decode(want);
      EXPECT_EQ(decoded, e.at("decoded")[i].get<std::string>()) << name << " text " << i;
      same_ids += got == want;
      same_text += decoded == e.at("decoded")[i].get<std::string>();
      tokens += want.size();
    }
    std::cout << name << ": " << same_ids << " of " << texts.size() << " texts (" << tokens << " tokens) encode and "
              << same_text << " decode as HF tokenizers does\n";
  }
}

// Every option of every tokenizer.json component at other values, options HF never writes,
// components of other kinds in each slot, and combinations of those edits, on the five released
// shapes (tests/fixtures/make_tokenizer_json_variants.py, HF `tokenizers` as reference): ptrain
// refuses a variant — at load, or the text it cannot tokenize as HF does, naming the file — or
// gives HF's ids and decoded text; a variant HF refuses (or panics on) is refused too.
TEST(Tokenizer, EveryTokenizerJsonVariantIsReadAsHfTokenizersReadsItOrRefused) {
  using nlohmann::json;
  const auto fixture = json::parse(read_text_file(test::fixture("tokenizer_json_variants.json")));
  std::map<std::string, json> bases;
  for (const auto& [name, path] : fixture.at("bases").items())
    bases[name] = json::parse(read_text_file(test::fixture(path.get<std::string>())));
  const auto& variants = fixture.at("variants");
  ASSERT_GE(variants.size(), 2000u);
  int read = 0, refused = 0, refused_text = 0, refused_by_both = 0, hf_panicked = 0;
  for (const auto& v : variants) {
    const std::string base = v.at("base").get<std::string>(), name = base + " / " + v.at("name").get<std::string>();
    test::TempDir dir;
    const std::string path = dir / "tokenizer.json";
    test::write_text(path, bases.at(base).patch(v.at("patch")).dump());
    std::unique_ptr<Tokenizer> tok;
    std::string why;
    try {
      tok = std::make_unique<Tokenizer>(path);
    } catch (const RuntimeError& e) {
      why = e.what();
    } catch (const std::exception& e) {  // anything else escaping is a defect: name the variant
      ADD_FAILURE() << name << ": " << e.what();
      continue;
    }
    if (v.contains("random")) {
      EXPECT_FALSE(tok) << name << ": HF draws its ids anew on each call (BPE dropout), ptrain reads it";
      refused_by_both += !tok;
      continue;
    }
    if (v.contains("error")) {
      EXPECT_FALSE(tok) << name << ": HF tokenizers refuses it (" << v.at("error") << ") but ptrain reads it";
      refused_by_both += !tok;
      continue;
    }
    if (!tok) {
      ++refused;
      EXPECT_NE(why.find(path), std::string::npos) << name << ": the refusal names no file: " << why;
      EXPECT_NE(v.at("name"), "as released") << name << ": " << why;
      continue;
    }
    const auto& texts = fixture.at("texts").at(base);
    bool text_refused = false;
    for (size_t i = 0; i < texts.size(); ++i) {
      const std::string text = texts[i].get<std::string>();
      const auto want = v.at("ids")[i].get<std::vector<int32_t>>();
      try {
        EXPECT_EQ(tok->encode(text), want) << name << ": text " << i << " '" << text << "'";
      } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << name << ": " << e.what();
        text_refused = true;
      }
      // Decoding HF's ids: HF's text. Where HF's decoder panics (0.23's Strip on a token shorter
      // than `stop`, fixed in later releases) there is nothing to compare: counted, not passed.
      const json& decoded = v.at("decoded")[i];
      try {
        const std::string got = tok->decode(want);
        if (decoded.is_null())
          ++hf_panicked;
        else
          EXPECT_EQ(got, decoded.get<std::string>()) << name << ": decoding text " << i;  // NOLINT
      } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << name << ": " << e.what();
        text_refused = true;
      }
    }
    const json& with_special = v.at("with_special");
    try {
      const auto got = tok->encode_with_special_tokens(texts[0].get<std::string>());
      EXPECT_FALSE(with_special.is_null()) << name << ": HF cannot add its special tokens, ptrain does";
      if (!with_special.is_null()) {
        EXPECT_EQ(got, with_special.get<std::vector<int32_t>>()) << name;
      }
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(path), std::string::npos) << name << ": " << e.what();
      text_refused = true;
    }
    EXPECT_FALSE(text_refused && v.at("name") == "as released") << name;
    ++read;
    refused_text += text_refused;
  }
  std::printf(
      "[ tokenizer.json ] %zu variants: %d read (%d of them with a text refused; %d decodings not compared: HF "
      "panicked), %d refused by ptrain at load, %d refused by both\n",
      variants.size(), read, refused_text, hf_panicked, refused, refused_by_both);
}

// A character the split regex's Unicode tables (PCRE2) could class otherwise than HF's newer ones
// is refused by name, not tokenized differently: U+31350 (CJK Extension H, Unicode 15, a letter
// in utf8proc's tables but unknown to PCRE2's) and U+A7DB (Unicode 16, unknown to both). A
// SentencePiece-style tokenizer without a split regex takes them.
TEST(Tokenizer, RefusesCharactersItsUnicodeTablesCannotClass) {
  Tokenizer tok(test::fixture("tokenizer_bpe"));
  for (const auto& [text, name] : std::vector<std::pair<std::string, std::string>>{
           {"rare \U00031350 ideograph", "U+31350"}, {"\"\ua7db\",", "U+A7DB"}}) {
    try {
      tok.encode(text);
      ADD_FAILURE() << "accepted " << name;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << e.what();
    }
  }
  EXPECT_FALSE(Tokenizer(test::fixture("tokenizer_families/llama2")).encode("\ua7db").empty());
  // In a file tokenized in chunks, the refusal names the file, the line and the byte of the file
  // (not of the chunk it was in): 50 lines of 12 bytes, then "x " and the character.
  test::TempDir dir;
  std::string text;
  for (int i = 0; i < 50; ++i) text += "hello world\n";
  text += "x \ua7db\nmore\n";
  test::write_text(dir / "text.txt", text);
  for (const int threads : {1, 2}) {
    try {
      tokenize_file(tok, dir / "text.txt", false, -1, nullptr, 64, threads);
      ADD_FAILURE() << "accepted U+A7DB";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("text.txt:51: byte 602 of the file"), std::string::npos) << e.what();
    }
  }
}

// A tokenizer.json from anywhere whose split regex backtracks without end: encoding fails under
// PCRE2's step limit, naming the pattern, instead of hanging (Python's re would never return).
TEST(Tokenizer, ASplitRegexThatBacktracksWithoutEndFailsNamingIt) {
  test::TempDir dir;
  test::write_text(dir / "tokenizer.json",
                   R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 1}, "merges": []}, "pre_tokenizer": )"
                   R"({"type": "Split", "pattern": {"Regex": "(a|aa)+$"}, "behavior": "Isolated", "invert": false}})");
  Tokenizer t(dir / "tokenizer.json");
  EXPECT_EQ(t.encode("aab"), (std::vector<int32_t>{0, 0, 1}));  // unmatched text stays one piece
  try {
    t.encode(std::string(64, 'a') + "!");
    ADD_FAILURE() << "64 'a's and '!' were split by (a|aa)+$";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("regex '(a|aa)+$'"), std::string::npos) << e.what();
  }
}

TEST(Tokenizer, RefusesWhatItCannotReadNamingIt) {
  test::TempDir dir;
  auto refused = [&](const std::string& json_text, const std::string& needle) {
    const std::string path = dir / "tokenizer.json";
    test::write_text(path, json_text);
    try {
      Tokenizer t(path);
      ADD_FAILURE() << "accepted: " << json_text;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(R"({"model": {"type": "Unigram", "vocab": []}, "normalizer": null, "pre_tokenizer": null})",
          "'Unigram' is not supported");
  refused(R"({"model": {"type": "WordPiece"}, "normalizer": null})", "'WordPiece' is not supported");
  const std::string bpe = R"("model": {"type": "BPE", "vocab": {"a": 0}, "merges": []})";
  refused("{" + bpe + R"(, "normalizer": {"type": "BertNormalizer"}})", "normalizer 'BertNormalizer' is not supported");
  refused("{" + bpe + R"(, "pre_tokenizer": {"type": "Whitespace"}})", "pre-tokenizer 'Whitespace' is not supported");
  refused(
      "{" + bpe +
          R"(, "pre_tokenizer": {"type": "Split", "pattern": {"Regex": "a"}, "behavior": "Removed", "invert": false}})",
      "Split behavior 'Removed'");
  refused("{" + bpe + R"(, "decoder": {"type": "WordPiece"}})", "decoder 'WordPiece' is not supported");
  const std::string flags = R"("lstrip": false, "rstrip": false, "normalized": false, "special": true)";
  refused("{" + bpe + R"(, "added_tokens": [{"id": 1, "content": "<x>", "single_word": true, )" + flags + "}]}",
          "uses single_word");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": [], "dropout": 0.1}})", "dropout");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": ["a b"]}})", "merge 'a b' names a token");
  refused("{not json", "not valid JSON");
  // Ids that are not small non-negative integers (found by fuzz_tokenizer: a float id was
  // converted with undefined behaviour; a huge one would size the id table).
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 1.9e97}, "merges": []}})", "token 'a' has id 1.9e+97");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 2147483647}, "merges": []}})", "token 'a' has id 2147483647");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": -1}, "merges": []}})", "token 'a' has id -1");
  refused("{" + bpe + R"(, "added_tokens": [{"id": 0.5, "content": "<x>", "single_word": false, )" + flags + "}]}",
          "added_tokens[0]: 'id' must be a non-negative integer, not 0.5");
  // Options HF does not read, or requires, or reads as another type (the whole set is compared
  // with HF in EveryTokenizerJsonVariantIsReadAsHfTokenizersReadsItOrRefused).
  refused("{" + bpe + R"(, "decoder": {"type": "Fuse", "fuse_all": true}})",
          "decoder (Fuse): option 'fuse_all' is not one ptrain reads (it takes none)");
  refused("{" + bpe + R"(, "decoder": {"type": "ByteLevel", "add_prefix_space": true}})",
          "decoder (ByteLevel): 'trim_offsets' is missing");
  refused("{" + bpe + R"(, "added_tokens": [{"id": 0, "content": "a", "single_word": "no", )" + flags + "}]}",
          "added_tokens[0]: 'single_word' must be true or false, not \"no\"");
  refused(R"({"model": {"type": "BPE", "vocab": {"a": 0, "b": 0}, "merges": []}})",
          "tokens 'a' and 'b' have the same id 0");
  refused("{" + bpe + R"(, "version": "2.0"})", "version \"2.0\" is not the one HF tokenizers reads");
  refused("{" + bpe + R"(, "truncation": {"max_length": 8, "strategy": "LongestFirst", "stride": 0}})",
          "makes HF tokenizers cut or pad every text this file encodes");
  try {
    Tokenizer t(dir / "missing");
    ADD_FAILURE() << "accepted a missing file";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("no tokenizer file"), std::string::npos) << e.what();
  }
  // A directory holding another tokenizer file and no tokenizer.json: the file named, with the way on.
  const auto refused_dir = [&](const std::string& file, const std::string& content, const std::string& needle) {
    test::TempDir d;
    test::write_text((d.path / file).string(), content);
    try {
      Tokenizer t(d.path.string());
      ADD_FAILURE() << "accepted a directory holding only " << file;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused_dir("tokenizer.model", "IQ== 0\nIg== 1\nIw== 2\n", "tokenizer.model, a tiktoken BPE file");
  refused_dir("tokenizer.model", std::string("\x0a\x0b\x0a\x05<unk>\x15\0\0\0\0\x18\x02", 16),
              "tokenizer.model, a SentencePiece model; ptrain reads tokenizer.json: save one with transformers");
  refused_dir("tekken.json", "{}", "holds Mistral's tekken.json");
}

// The post-processor (what HF's encode(add_special_tokens=True) adds around one text, as
// `generate` encodes plain prompts): TemplateProcessing's special tokens before and after the
// text, ByteLevel adding none; a post-processor ptrain does not read is named when it is needed,
// never skipped. (The hf_chat / hf_qwen_chat cases are checked against transformers by
// sweep.generate_parity.)
TEST(Tokenizer, SpecialTokensComeFromThePostProcessorOrAreRefusedByName) {
  test::TempDir dir;
  const std::string path = dir / "tokenizer.json";
  const std::string base =
      R"("model": {"type": "BPE", "vocab": {"a": 0, "b": 1, "<s>": 2, "</s>": 3}, "merges": []},
         "added_tokens": [
           {"id": 2, "content": "<s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
            "special": true},
           {"id": 3, "content": "</s>", "single_word": false, "lstrip": false, "rstrip": false, "normalized": false,
            "special": true}])";
  test::write_text(path, "{" + base + R"(, "post_processor": {"type": "Sequence", "processors": [
      {"type": "ByteLevel", "add_prefix_space": true, "trim_offsets": false},
      {"type": "TemplateProcessing", "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                                {"Sequence": {"id": "A", "type_id": 0}},
                                                {"SpecialToken": {"id": "</s>", "type_id": 0}}],
       "pair": [],
       "special_tokens": {"<s>": {"id": "<s>", "ids": [2], "tokens": ["<s>"]},
                          "</s>": {"id": "</s>", "ids": [3], "tokens": ["</s>"]}}}]}})");
  EXPECT_EQ(Tokenizer(path).encode_with_special_tokens("ab"), (std::vector<int32_t>{2, 0, 1, 3}));
  EXPECT_EQ(Tokenizer(path).encode("ab"), (std::vector<int32_t>{0, 1}));
  test::write_text(path, "{" + base + "}");  // none: nothing added
  EXPECT_EQ(Tokenizer(path).encode_with_special_tokens("ab"), (std::vector<int32_t>{0, 1}));
  test::write_text(
      path,
      "{" + base + R"(, "post_processor": {"type": "RobertaProcessing", "sep": ["</s>", 3], "cls": ["<s>", 2]}})");
  const Tokenizer roberta(path);  // loads: training does not use the post-processor
  try {
    roberta.encode_with_special_tokens("ab");
    ADD_FAILURE() << "an unread post-processor was skipped";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("post_processor 'RobertaProcessing' is not supported"), std::string::npos)
        << e.what();
  }
}

// A corpus file tokenizes in chunks cut only where nothing spans the cut: the same ids as
// encoding the whole text at once, for every family's set-up; JSONL documents each end with <|end_of_text|>, and a
// malformed line is an error naming file:line.
TEST(Tokenizer, FilesTokenizeInChunksExactlyAndJsonlNamesBadLines) {
  Tokenizer tok(test::fixture("tokenizer_bpe"));
  const auto expected = nlohmann::json::parse(read_text_file(test::fixture("tokenizer_bpe_expected.json")));
  std::string text;
  for (int rep = 0; rep < 3; ++rep)
    for (const auto& t : expected.at("texts")) text += t.get<std::string>() + "\n";
  test::TempDir dir;
  test::write_text(dir / "corpus.txt", text);
  const auto whole = tok.encode(text);
  int64_t calls = 0;
  const auto chunked = tokenize_file(
      tok, dir / "corpus.txt", false, -1, [&](int64_t, int64_t, int64_t) { ++calls; }, 64);
  EXPECT_EQ(std::vector<uint32_t>(whole.begin(), whole.end()), chunked);
  EXPECT_GT(calls, 10) << "the small chunk size must cut the text many times";

  // Every family's set-up: its texts (and an lstrip added token after a newline) as one file.
  // Cuts fall only where nothing spans them: after the runs of spaces the split regexes part alike
  // at a text's end (GPT-2's parts "pass\n\nthe" otherwise than a text ending "pass\n\n"), where no merge
  // joins the newline and the next character for the SentencePiece-style ones with Metaspace's
  // "first" scheme (the parts after the first encoded as its continuation), never behind Llama
  // 2's Prepend normalizer, Metaspace's "always" scheme or a regex Replace (which may match across).
  const auto families = nlohmann::json::parse(read_text_file(test::fixture("tokenizer_families_expected.json")));
  for (const auto& [name, e] : families.items()) {
    Tokenizer family(test::fixture("tokenizer_families/" + name));
    std::string corpus;
    for (int rep = 0; rep < 2; ++rep)
      for (const auto& t : e.at("texts")) corpus += t.get<std::string>() + "\nthe model\n<tool_call>x\n";
    test::write_text(dir / "family.txt", corpus);
    const auto all = family.encode(corpus);
    for (const int threads : {1, 2}) {
      int64_t parts = 0;
      const auto got = tokenize_file(
          family, dir / "family.txt", false, -1, [&](int64_t, int64_t, int64_t) { ++parts; }, 64, threads);
      EXPECT_EQ(std::vector<uint32_t>(all.begin(), all.end()), got) << name << ", " << threads << " threads";
      if (name == "llama2" || name == "nfd" || name == "normalizers")
        EXPECT_EQ(parts, 1) << name;
      else
        EXPECT_GT(parts, 20) << name << ": the small chunk size must cut the text many times";
    }
  }
  // The family set-up behind the regex Replace again, without it, under two split regexes: GPT-2's
  // (ByteLevel's), whose \s+(?!\S) parts "says\n\nmore" otherwise than a text ending "says\n\n" —
  // the probes at load leave only a lone newline to cut after —, and one that takes one space
  // into the word after it ("\nmore" one piece, but "\n\n" then "more"), which leaves no lone
  // newline, only a blank line.
  auto set_up = nlohmann::json::parse(read_text_file(test::fixture("tokenizer_families/normalizers/tokenizer.json")));
  set_up["normalizer"] = nullptr;
  const std::vector<std::pair<std::string, std::array<bool, 2>>> regexes{
      // {pre_tokenizer, cuts without / with blank lines}
      {R"({"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": true})", {true, true}},
      {R"({"type": "Sequence", "pretokenizers": [
          {"type": "Split", "pattern": {"Regex": "\\s?\\p{L}+|\\p{N}+|[^\\s\\p{L}\\p{N}]+|\\s+"},
           "behavior": "Isolated", "invert": false},
          {"type": "ByteLevel", "add_prefix_space": false, "trim_offsets": true, "use_regex": false}]})",
       {false, true}}};
  for (const auto& [pre, cuts] : regexes) {
    set_up["pre_tokenizer"] = nlohmann::json::parse(pre);
    test::write_text(dir / "set_up.json", set_up.dump());
    const Tokenizer split(dir / "set_up.json");
    for (const bool blank : {false, true}) {
      std::string lines;
      for (int i = 0; i < 200; ++i)
        lines += "the model " + std::to_string(i) + "\nsays\n" + (blank ? "\n" : "") + "more.\n";
      test::write_text(dir / "lines.txt", lines);
      const auto lines_whole = split.encode(lines);
      int64_t parts = 0;
      EXPECT_EQ(std::vector<uint32_t>(lines_whole.begin(), lines_whole.end()),
                tokenize_file(
                    split, dir / "lines.txt", false, -1, [&](int64_t, int64_t, int64_t) { ++parts; }, 64, 2))
          << pre << (blank ? ", blank lines" : "");
      if (cuts[blank])
        EXPECT_GT(parts, 20) << pre;
      else
        EXPECT_EQ(parts, 1) << pre;
    }
  }

  const int32_t eot = tok.id_of("<|end_of_text|>").value();
  test::write_text(dir / "docs.jsonl", "{\"text\": \"Hello world!\"}\n\n{\"text\": \"caf\u00e9 12345\"}\n");
  std::vector<uint32_t> want;
  for (const std::string doc : {"Hello world!", "caf\u00e9 12345"}) {
    for (int32_t id : tok.encode(doc)) want.push_back(static_cast<uint32_t>(id));
    want.push_back(static_cast<uint32_t>(eot));
  }
  EXPECT_EQ(tokenize_file(tok, dir / "docs.jsonl", true, eot, nullptr), want);
  // Many records, in chunks of a few lines on 1 and 2 threads: each record's ids and the marker, in
  // order; a bad line in a later chunk is named by its line in the file.
  std::string many;
  std::vector<uint32_t> many_want;
  for (int i = 0; i < 300; ++i) {
    const std::string doc =
        expected.at("texts")[static_cast<size_t>(i) % expected.at("texts").size()].get<std::string>();
    many += nlohmann::json{{"text", doc}}.dump() + (i % 7 == 0 ? "\n\n" : "\n");
    for (int32_t id : tok.encode(doc)) many_want.push_back(static_cast<uint32_t>(id));
    many_want.push_back(static_cast<uint32_t>(eot));
  }
  test::write_text(dir / "many.jsonl", many);
  for (const int threads : {1, 2}) {
    int64_t parts = 0;
    EXPECT_EQ(tokenize_file(
                  tok, dir / "many.jsonl", true, eot, [&](int64_t, int64_t, int64_t) { ++parts; }, 256, threads),
              many_want)
        << threads << " threads";
    EXPECT_GT(parts, 20);
  }
  for (const auto& [line, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{\"text\": \"ok\"}\n{\"txt\": \"no text field\"}\n",
            "docs_bad.jsonl:2: a JSONL record needs a string field"},
           {"{\"text\": \"ok\"}\n{\"text\": \"ok\"}\n{broken\n", "docs_bad.jsonl:3: not valid JSON"},
           {many + "{broken\n" + many, "docs_bad.jsonl:344: not valid JSON"}}) {  // 300 records, 43 blank lines
    test::write_text(dir / "docs_bad.jsonl", line);
    for (const int threads : {1, 2}) try {
        tokenize_file(tok, dir / "docs_bad.jsonl", true, eot, nullptr, 256, threads);
        ADD_FAILURE() << "accepted " << line;
      } catch (const RuntimeError& e) {
        EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      }
  }
}

// A chat rendered as Llama 3 Instruct's template renders it (transformers' apply_chat_template
// in tests/fixtures/make_tokenizer_fixtures.py): the same ids; the loss mask trains only the
// assistant replies; and the model's loss with the prompt masked (-100) equals transformers'
// loss on the same model (tests/fixtures/hf_chat) — computed here by the model forward alone,
// without FSDP.
// A model directory's tokenizer_config.json and config.json against transformers' AutoTokenizer
// (tests/fixtures/make_tokenizer_dir_variants.py: four release-shaped directories, Llama 3,
// TinyLlama / Llama 2, Mistral v0.3 and Qwen2.5, and several hundred variants of their
// tokenizer_config.json / config.json: every tokenizer_class and model_type, legacy,
// add_prefix_space, special tokens tokenizer.json lacks, added-token flags, split_special_tokens,
// remote code, unknown keys, seeded combinations; the legacy special_tokens_map.json and
// added_tokens.json, which count only without added_tokens_decoder; fast_tokenizer_files, which
// makes transformers read a tokenizer.VERSION.json in place of tokenizer.json). Each is read exactly as transformers
// reads it — the same ids for every text, the same decoded text, the same special tokens — or refused naming its file;
// what transformers refuses ptrain refuses; the releases are read, and so are named special tokens with other flags
// than tokenizer.json's that transformers swaps for its own.
TEST(Tokenizer, ModelDirectoriesAreReadAsTransformersReadsThemOrRefused) {
  namespace fs = std::filesystem;
  const auto fixture = nlohmann::json::parse(read_text_file(test::fixture("tokenizer_dir_variants.json")));
  const auto& variants = fixture.at("variants");
  ASSERT_GE(variants.size(), 400u);
  std::map<std::string, int> read_as, refused_by_both;
  int refused = 0, refused_text = 0, equal = 0, rebuilt = 0;
  for (const auto& v : variants) {
    const std::string base = v.at("base").get<std::string>(), name = base + " / " + v.at("name").get<std::string>();
    test::TempDir dir;
    fs::copy_file(test::fixture("tokenizer_dirs/" + base + "/tokenizer.json"), dir.path / "tokenizer.json");
    if (!v.at("tokenizer_config").is_null())
      test::write_text((dir.path / "tokenizer_config.json").string(), v.at("tokenizer_config").dump());
    if (!v.at("config").is_null()) test::write_text((dir.path / "config.json").string(), v.at("config").dump());
    for (const auto& [file, content] : v.at("files").items()) {
      if (content != "tokenizer.json without merges") {
        test::write_text((dir.path / file).string(), content.dump());
        continue;
      }
      auto versioned = nlohmann::json::parse(read_text_file((dir.path / "tokenizer.json").string()));
      versioned["model"]["merges"] = nlohmann::json::array();
      test::write_text((dir.path / file).string(), versioned.dump());
    }
    std::unique_ptr<Tokenizer> tok;
    std::string why;
    try {
      tok = std::make_unique<Tokenizer>(dir.path.string());
    } catch (const std::runtime_error& e) {  // RuntimeError, or UnsupportedInput (a version list)
      why = e.what();
    }
    if (v.contains("error")) {
      EXPECT_FALSE(tok) << name << ": transformers refuses it (" << v.at("error") << ") but ptrain reads it";
      ++refused_by_both[v.at("error").get<std::string>().substr(0, 40)];
      continue;
    }
    if (!tok) {
      ++refused;
      EXPECT_NE(why.find(dir.path.string()), std::string::npos) << name << ": the refusal names no file: " << why;
      const std::string n = v.at("name").get<std::string>();
      EXPECT_FALSE(n == "release" || n == "no tokenizer_config.json" || n == "no config.json" || n == "neither")
          << name << ": a release-shaped directory is refused: " << why;
      EXPECT_FALSE(v.value("read", false))
          << name << ": transformers reads it as written (a named token swapped for the one it holds, or the "
          << "tokenizer file fast_tokenizer_files names), yet ptrain refuses it: " << why;
      continue;
    }
    const std::string cls = v.at("class").get<std::string>();
    EXPECT_EQ(tok->reading().substr(0, cls.size()), cls) << name << ": " << tok->reading();
    // A text may be refused where transformers drops what its vocabulary cannot represent (a
    // SentencePiece vocabulary under Qwen2Tokenizer's byte-level pipeline): named, never dropped.
    try {
      const auto& texts = v.at("texts");
      bool same = true;
      for (size_t i = 0; i < texts.size(); ++i) {
        const std::string text = texts[i].get<std::string>();
        const auto want = v.at("ids")[i].get<std::vector<int32_t>>();
        const auto got = tok->encode(text);
        EXPECT_EQ(got, want) << name << ": text " << i << " '" << text << "'";
        EXPECT_EQ(tok->decode(want), v.at("decoded")[i].get<std::string>()) << name << ": decoding text " << i;
        same = same && got == want && tok->decode(want) == v.at("decoded")[i].get<std::string>();
      }
      EXPECT_EQ(tok->encode_with_special_tokens(texts[0].get<std::string>()),
                v.at("with_special").get<std::vector<int32_t>>())
          << name;
      // The tokens a chat template's bos_token / eos_token render.
      const auto special = [&](const char* key) { return v.at(key).is_null() ? "" : v.at(key).get<std::string>(); };
      ASSERT_TRUE(tok->template_tokens()) << name;
      EXPECT_EQ(tok->template_tokens()->first, special("bos_token")) << name;
      EXPECT_EQ(tok->template_tokens()->second, special("eos_token")) << name;
      equal += same;
      ++read_as[cls];
      rebuilt += cls != "TokenizersBackend";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(dir.path.string()), std::string::npos) << name << ": " << e.what();
      ++refused_text;
    }
  }
  std::string classes, errors;
  for (const auto& [c, n] : read_as) classes += " " + c + " " + std::to_string(n);
  for (const auto& [e, n] : refused_by_both) errors += "\n    " + std::to_string(n) + " x " + e;
  std::printf(
      "[ tokenizer directories ] %zu variants: %d read and equal (%d with the pipeline rebuilt;%s), %d refused "
      "by ptrain at load, %d read but a text refused, refused by both:%s\n",
      variants.size(), equal, rebuilt, classes.c_str(), refused, refused_text, errors.c_str());
}

// fast_tokenizer_files may name a file outside the model directory ("../tokenizer.4.0.0.json", an
// absolute path), which transformers would read: ptrain refuses the name rather than read a file
// the directory does not hold; one in a folder inside it is read.
TEST(Tokenizer, FastTokenizerFilesOutsideTheDirectoryAreRefused) {
  namespace fs = std::filesystem;
  test::TempDir root;
  const fs::path dir = root.path / "model";
  fs::create_directories(dir / "sub");
  for (const fs::path& to :
       {dir / "tokenizer.json", root.path / "tokenizer.4.0.0.json", dir / "sub/tokenizer.4.0.0.json"})
    fs::copy_file(test::fixture("tokenizer_dirs/llama3/tokenizer.json"), to);
  const auto listing = [&](const std::string& name) {
    test::write_text((dir / "tokenizer_config.json").string(), R"({"fast_tokenizer_files": [")" + name + R"("]})");
  };
  for (const std::string& name : {std::string("../tokenizer.4.0.0.json"), (root.path / "tokenizer.4.0.0.json").string(),
                                  std::string("sub/../../tokenizer.4.0.0.json")}) {
    listing(name);
    try {
      Tokenizer tok(dir.string());
      ADD_FAILURE() << name << ": read a file outside the model directory";
    } catch (const UnsupportedInput& e) {
      EXPECT_NE(std::string(e.what()).find("outside the model directory"), std::string::npos) << e.what();
    }
  }
  listing("sub/tokenizer.4.0.0.json");
  EXPECT_NE(Tokenizer(dir.string()).reading().find("tokenizer.4.0.0.json read for tokenizer.json"), std::string::npos);
}

// Mistral's releases hold tekken.json beside tokenizer.json: transformers without mistral-common
// installed reads tokenizer.json (as ptrain does, the same ids); with it, tekken.json. The log says
// which file ptrain read and that tekken.json was not.
TEST(Tokenizer, TekkenJsonBesideTokenizerJsonIsNamedAsNotRead) {
  namespace fs = std::filesystem;
  test::TempDir dir;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json"})
    fs::copy_file(test::fixture(std::string("tokenizer_dirs/mistral/") + f), dir.path / f);
  const std::string text = "Hello [INST] world";
  const Tokenizer plain(dir.path.string());
  EXPECT_EQ(plain.reading().find("tekken.json"), std::string::npos) << plain.reading();
  test::write_text((dir.path / "tekken.json").string(), "{}");  // never opened
  const Tokenizer with_tekken(dir.path.string());
  EXPECT_NE(with_tekken.reading().find("tekken.json not read: tokenizer.json is"), std::string::npos)
      << with_tekken.reading();
  EXPECT_EQ(with_tekken.encode(text), plain.encode(text));
}

TEST(Chat, RendersAndMasksAsTransformersAndGivesItsLoss) {
  Tokenizer tok(test::fixture("tokenizer_bpe"));
  const auto expected = nlohmann::json::parse(read_text_file(test::fixture("hf_chat_expected.json")));
  std::vector<ChatMessage> messages;
  for (const auto& m : expected.at("messages")) messages.push_back({m.at("role"), m.at("content")});
  const ChatFormat format = chat_format(tok, ChatTemplate::automatic);
  ASSERT_EQ(format.kind, ChatTemplate::llama3);
  const Sample s = render_chat(tok, format, messages, false);
  EXPECT_EQ(s.ids, expected.at("ids").get<std::vector<int32_t>>());
  const auto labels = expected.at("labels").get<std::vector<int64_t>>();
  ASSERT_EQ(s.trained.size(), labels.size());
  for (size_t t = 0; t < labels.size(); ++t) EXPECT_EQ(s.trained[t] != 0, labels[t] != -100) << "position " << t;

  const std::string dir = test::fixture("hf_chat");
  const LlamaShape shape = read_hf_config(dir);
  DenseWeights model(shape, at::kFloat, at::kCPU);
  model.load(HfCheckpoint(dir).by_name());
  const auto n = static_cast<int64_t>(s.ids.size());
  at::Tensor ids = at::tensor(std::vector<int64_t>(s.ids.begin(), s.ids.end()), at::kLong).view({1, n});
  at::Tensor targets = at::tensor(s.targets(), at::kLong).view({1, n - 1});
  at::NoGradGuard no_grad;
  const double loss =
      llama_loss(model, shape, model.rope(n), ids.narrow(1, 0, n - 1), targets, 0, at::kFloat).item<double>();
  EXPECT_NEAR(loss, expected.at("loss").get<double>(), 1e-5);
  std::cout << "chat: " << n << " tokens, " << std::count(s.trained.begin(), s.trained.end(), 1) << " trained; loss "
            << loss << " (transformers " << expected.at("loss").get<double>() << ")\n";

  // Everything trained with train_on_prompt; an unknown role is refused, naming it.
  const Sample all = render_chat(tok, format, messages, true);
  EXPECT_EQ(all.ids, s.ids);
  EXPECT_EQ(std::count(all.trained.begin(), all.trained.end(), 1), n);
  try {
    render_chat(tok, format, {{"narrator", "hi"}}, false);
    ADD_FAILURE() << "accepted an unknown role";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("unknown role 'narrator'"), std::string::npos) << e.what();
  }
}

// Each chat template as transformers' apply_chat_template renders it with the family's own
// template (tests/fixtures/make_chat_template_fixtures.py): recognized from the model directory's
// tokenizer_config.json, the same ids for multi-turn chats with and without a system message, and
// the replies — what the template adds after each assistant header through its end of turn —
// trained, nothing else.
TEST(Chat, EveryTemplateRendersAsTransformersAndMasksTheReplies) {
  const auto expected = nlohmann::json::parse(read_text_file(test::fixture("chat_templates_expected.json")));
  const std::map<std::string, ChatTemplate> kinds{{"llama3.1", ChatTemplate::llama3_1},
                                                  {"llama3.2", ChatTemplate::llama3_2},
                                                  {"qwen2.5", ChatTemplate::qwen2_5},
                                                  {"chatml", ChatTemplate::chatml},
                                                  {"qwen3", ChatTemplate::qwen3},
                                                  {"mistral", ChatTemplate::mistral},
                                                  {"mistral-v0.2", ChatTemplate::mistral_v0_2},
                                                  {"mistral-v0.1", ChatTemplate::mistral_v0_1},
                                                  {"mistral-system-first", ChatTemplate::mistral_system_first},
                                                  {"deepseek-r1", ChatTemplate::deepseek_r1},
                                                  {"qwq", ChatTemplate::qwq},
                                                  {"mistral-nemo", ChatTemplate::mistral_nemo},
                                                  {"devstral", ChatTemplate::devstral},
                                                  {"mistral-tekken", ChatTemplate::mistral_tekken}};
  ASSERT_EQ(expected.size(), kinds.size());
  for (const auto& [name, e] : expected.items()) {
    Tokenizer tok(test::fixture("chat_templates/" + name));
    ChatFormat format = chat_format(tok, ChatTemplate::automatic);
    EXPECT_EQ(format.kind, kinds.at(name)) << name << " recognized from " << format.source;
    if (format.kind == ChatTemplate::llama3_2) format.date = "26 Jul 2024";  // the fixture's date_string (else today)
    int64_t trained = 0, tokens = 0, without_reasoning = 0;
    for (size_t c = 0; c < e.at("chats").size(); ++c) {
      std::vector<ChatMessage> messages;
      for (const auto& m : e.at("chats")[c]) {
        messages.push_back({m.at("role"), m.at("content")});
        if (m.contains("reasoning_content")) messages.back().reasoning = m.at("reasoning_content").get<std::string>();
      }
      const Sample s = render_chat(tok, format, messages, false);
      EXPECT_EQ(s.ids, e.at("ids")[c].get<std::vector<int32_t>>()) << name << " chat " << c;
      const auto labels = e.at("labels")[c].get<std::vector<int64_t>>();
      ASSERT_EQ(s.trained.size(), labels.size()) << name << " chat " << c;
      for (size_t t = 0; t < labels.size(); ++t)
        EXPECT_EQ(s.trained[t] != 0, labels[t] != -100) << name << " chat " << c << " position " << t;
      trained += std::count(s.trained.begin(), s.trained.end(), 1);
      tokens += static_cast<int64_t>(s.ids.size());
      // The dataset report's count of replies losing their reasoning = the replies whose reasoning
      // (reasoning_content, else the text between <think> and </think>) transformers' rendering lacks.
      const std::string rendered = tok.decode(e.at("ids")[c].get<std::vector<int32_t>>());
      int64_t lacking = 0;
      for (const ChatMessage& m : messages) {
        std::string reasoning = m.reasoning.value_or("");
        const size_t close = m.content.find("</think>"), open = m.content.rfind("<think>", close);
        if (!m.reasoning && close != std::string::npos)
          reasoning = m.content.substr(open == std::string::npos ? 0 : open + 7,
                                       close - (open == std::string::npos ? 0 : open + 7));
        reasoning.erase(0, reasoning.find_first_not_of(" \n"));
        reasoning.erase(reasoning.find_last_not_of(" \n") + 1);
        lacking += m.role == "assistant" && !reasoning.empty() && rendered.find(reasoning) == std::string::npos;
      }
      EXPECT_EQ(replies_losing_reasoning(format, messages), lacking) << name << " chat " << c << ": " << rendered;
      without_reasoning += lacking;
    }
    // Chats the template raises on (mistral-common's: a reply first, an empty reply): refused too.
    for (const auto& r : e.value("refused", nlohmann::json::array())) {
      std::vector<ChatMessage> messages;
      for (const auto& m : r.at("chat")) messages.push_back({m.at("role"), m.at("content")});
      EXPECT_THROW(render_chat(tok, format, messages, false), RuntimeError) << name << ": " << r.at("error");
    }
    std::cout << name << ": " << e.at("chats").size() << " chats, " << tokens << " tokens, " << trained << " trained, "
              << without_reasoning << " replies without their reasoning, as transformers renders them\n";
    // Prompts to answer (add_generation_prompt) with other releases of the family's template.
    for (const auto& p : e.value("prompts", nlohmann::json::array())) {
      const RecognizedTemplate known = recognize_chat_template(p.at("template"), name + " prompt template");
      EXPECT_EQ(known.kind, format.kind) << known.model;
      ChatFormat f = format;
      f.think_prompt = known.think_prompt;
      std::vector<ChatMessage> messages;
      for (const auto& m : p.at("chat")) messages.push_back({m.at("role"), m.at("content")});
      EXPECT_EQ(render_prompt(tok, f, messages), p.at("ids").get<std::vector<int32_t>>()) << known.model;
    }
  }
}

// Templates ptrain does not render are refused with the file and the options, never guessed.
// A directory's template renders bos_token as its tokenizer files resolve it (transformers: null
// is None, special_tokens_map.json overrides tokenizer_config.json without added_tokens_decoder);
// ptrain renders the released token there, so another one is refused naming the key.
TEST(Chat, TemplateTokensOtherThanTheReleasedOnesAreRefused) {
  namespace fs = std::filesystem;
  test::TempDir dir;
  for (const char* f : {"tokenizer.json", "chat_template.jinja", "config.json"})
    fs::copy_file(test::fixture(std::string("hf_chat/") + f), dir.path / f);
  auto config = [&](const std::string& bos) {
    test::write_text(
        (dir.path / "tokenizer_config.json").string(),
        "{\"bos_token\": " + bos + ", \"eos_token\": \"<|eot_id|>\", \"tokenizer_class\": \"TokenizersBackend\"}");
    return chat_format(Tokenizer(dir.path.string()), ChatTemplate::automatic);
  };
  EXPECT_EQ(config("\"<|begin_of_text|>\"").kind, ChatTemplate::llama3);
  for (const std::string bos : {"null", "\"<|end_of_text|>\""}) {
    try {
      config(bos);
      ADD_FAILURE() << "bos_token " << bos << " was rendered as <|begin_of_text|>";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("chat_template.jinja: the chat template renders bos_token, which this "
                                           "tokenizer's files make"),
                std::string::npos)
          << e.what();
    }
  }
  // special_tokens_map.json counts only without added_tokens_decoder: here it does.
  test::write_text((dir.path / "special_tokens_map.json").string(), "{\"bos_token\": \"<|end_of_text|>\"}");
  EXPECT_THROW(config("\"<|begin_of_text|>\""), RuntimeError);
  EXPECT_EQ(chat_format(Tokenizer(dir.path.string()), ChatTemplate::llama3).kind, ChatTemplate::llama3);  // named
}

// DeepSeek-R1's template renders bos_token as the directory's files resolve it: a None one is
// refused by name; without a directory (a tokenizer.json file) the released token is rendered
// where the tokenizer has it, and a tokenizer without it is refused.
TEST(Chat, DeepSeekBosTokenIsTheDirectorysOrTheReleasedOne) {
  test::TempDir dir;
  const std::string src = test::fixture("chat_templates/deepseek-r1");
  std::filesystem::copy_file(src + "/tokenizer.json", dir / "tokenizer.json");
  auto config = nlohmann::json::parse(read_text_file(src + "/tokenizer_config.json"));
  EXPECT_EQ(chat_format(Tokenizer(src), ChatTemplate::automatic).bos_token, "<｜begin▁of▁sentence｜>");
  config["bos_token"] = "<｜User｜>";  // another token: rendered, as transformers renders it
  test::write_text(dir / "tokenizer_config.json", config.dump());
  EXPECT_EQ(chat_format(Tokenizer(dir.path), ChatTemplate::automatic).bos_token, "<｜User｜>");
  config["bos_token"] = nullptr;
  test::write_text(dir / "tokenizer_config.json", config.dump());
  try {
    chat_format(Tokenizer(dir.path), ChatTemplate::automatic);
    ADD_FAILURE() << "a None bos_token was rendered";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("renders bos_token, which this tokenizer's files make None"),
              std::string::npos)
        << e.what();
  }
  EXPECT_EQ(chat_format(Tokenizer(src + "/tokenizer.json"), ChatTemplate::deepseek_r1).bos_token,
            "<｜begin▁of▁sentence｜>");
  try {
    chat_format(Tokenizer(test::fixture("chat_templates/chatml/tokenizer.json")), ChatTemplate::deepseek_r1);
    ADD_FAILURE() << "deepseek-r1 rendered with a tokenizer that lacks its bos_token";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("which this tokenizer does not have as a token"), std::string::npos)
        << e.what();
  }
}

// The default template is picked as transformers picks it (checked with transformers 5.23:
// additional_chat_templates/default.jinja wins over chat_template.jinja; named extra templates
// without chat_template.jinja leave no default, and transformers refuses to render).
TEST(Chat, TheDefaultTemplateIsTheOneTransformersPicks) {
  namespace fs = std::filesystem;
  test::TempDir dir;
  for (const char* f : {"tokenizer.json", "tokenizer_config.json", "chat_template.jinja"})
    fs::copy_file(test::fixture(std::string("hf_chat/") + f), dir.path / f);
  fs::create_directories(dir.path / "additional_chat_templates");
  test::write_text((dir.path / "additional_chat_templates/tool_use.jinja").string(), "{{ 'x' }}");
  EXPECT_EQ(chat_format(Tokenizer(dir.path.string()), ChatTemplate::automatic).kind, ChatTemplate::llama3);
  fs::rename(dir.path / "chat_template.jinja", dir.path / "elsewhere.jinja");
  try {
    chat_format(Tokenizer(dir.path.string()), ChatTemplate::automatic);
    ADD_FAILURE() << "a directory without a default template was read";
  } catch (const RuntimeError& e) {
    EXPECT_NE(std::string(e.what()).find("additional_chat_templates holds named chat templates (tool_use.jinja)"),
              std::string::npos)
        << e.what();
  }
  fs::rename(dir.path / "elsewhere.jinja", dir.path / "additional_chat_templates/default.jinja");
  EXPECT_EQ(chat_format(Tokenizer(dir.path.string()), ChatTemplate::automatic).source,
            (dir.path / "additional_chat_templates/default.jinja").string() + ", Llama 3 Instruct's template");
}

TEST(Chat, UnknownTemplatesAreRefusedNamingTheOptions) {
  test::TempDir dir;
  for (const auto& [tmpl, needle] : std::vector<std::pair<std::string, std::string>>{
           {"{% for m in messages %}{{ '<start_of_turn>' + m.content + '<end_of_turn>' }}{% endfor %}",
            "line 1: the literal \"<end_of_turn>\" is not in"},
           {"{{ '<|im_start|>' }}{% if '</think>' in content %}<think>{% endif %}",
            "line 1: the chat template renders text outside its tags (\"<think>\")"},
           {"{{ bos_token }}{% for message in messages %}{{ '[INST] ' + message['content'] + ' [/INST]' }}{% endfor %}",
            "not one ptrain renders"},
           {"{% for message in messages %}\n{% raw %}{{ x }}{% endraw %}{% endfor %}", "uses line 2: {% raw %}"},
           {"{{ '<|im_start|>\\u12' }}", "malformed \\u escape"},
           {"{% if messages %}{{ 'a' }}", "never closed"},
           {"{{ 'a }}", "line 1: a string literal is never closed"},
           // ChatML's own literals with one test negated: a tag, not a literal, differs
           {"{% for message in messages %}{{'<|im_start|>' + message['role'] + '\\n' + message['content'] + "
            "'<|im_end|>' + '\\n'}}{% endfor %}{% if not add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
            "{% endif %}",
            "line 1: the tag \"{% if not add_generation_prompt %}\" is not ChatML's \"{% if add_generation_prompt "
            "%}\""},
           {"{% for t in tools %}{{ 'x' }}{% else %}{{ 'y' }}{% endfor %}", "{% else %} of a {% for %} over tools"}}) {
    std::filesystem::copy_file(test::fixture("chat_templates/chatml/tokenizer.json"), dir / "tokenizer.json",
                               std::filesystem::copy_options::overwrite_existing);
    test::write_text(dir / "tokenizer_config.json", nlohmann::json{{"chat_template", tmpl}}.dump());
    try {
      chat_format(Tokenizer(dir.path), ChatTemplate::automatic);
      ADD_FAILURE() << "accepted " << tmpl;
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("data.chat_template"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find("tokenizer_config.json"), std::string::npos) << e.what();
    }
  }
}

// A template from the internet may be huge or deeply nested: it is read in time linear in its
// size and without recursion into its blocks, and refused, not crashed on (200,000 nested
// {% if %}, a condition in 100,000 parentheses, a 4 MiB string literal).
TEST(Chat, HugeAndDeeplyNestedTemplatesAreRefusedWithoutCrashing) {
  std::string nested;
  for (int i = 0; i < 200000; ++i) nested += "{% if tools %}";
  nested += "{{ '<|im_start|>' }}";
  for (int i = 0; i < 200000; ++i) nested += "{% endif %}";
  const std::string parens = "{% if " + std::string(100000, '(') + "tools" + std::string(100000, ')') +
                             " %}{{ 'x' }}{% endif %}{{ '<|im_start|>' + message['role'] }}";
  const std::string literal = "{{ '" + std::string(4 << 20, 'a') + "' }}";
  for (const auto& [name, text] : std::vector<std::pair<std::string, std::string>>{
           {"nested", nested}, {"parentheses", parens}, {"literal", literal}}) {
    try {
      recognize_chat_template(text, name);
      ADD_FAILURE() << name << " recognized";
    } catch (const RuntimeError& e) {
      EXPECT_NE(std::string(e.what()).find("not one ptrain renders"), std::string::npos) << e.what();
    }
  }
}

// `auto` never renders a template differently than the template itself: each variant of
// chat_template_variants.json (generated into the build tree by make_chat_template_variants.py: the family templates
// with one edit each — a literal changed, a trim / strip / bos_token / eos_token dropped or added —,
// other families' templates, and templates with tool-call branches and comments added) is either
// refused or renders every chat, with and without the generation prompt, as transformers'
// apply_chat_template does; a chat transformers' template refuses is refused too. The family
// templates and those with only tool branches or comments added must be recognized.
TEST(Chat, EveryTemplateVariantIsRenderedAsTransformersOrRefused) {
  const auto fixture = nlohmann::json::parse(read_text_file(test::kChatVariantsPath));
  std::vector<std::vector<ChatMessage>> chats;
  for (const auto& chat : fixture.at("chats")) {
    chats.emplace_back();
    for (const auto& m : chat) {
      chats.back().push_back({m.at("role"), m.at("content")});
      if (m.contains("reasoning_content")) chats.back().back().reasoning = m.at("reasoning_content").get<std::string>();
    }
  }
  int read = 0, refused = 0, compared = 0, both_refuse = 0, tools_compared = 0, tools_refused = 0;
  std::set<std::string> tools_read;          // the variants that rendered a chat with tools
  std::map<std::string, int> refusals;       // why, by the start of the message after the file name
  std::map<std::string, std::string> bases;  // a one-edit variant is its base's template with a splice
  for (const auto& v : fixture.at("variants"))
    if (v.contains("template") && v.at("base").is_string() && v.at("base") == v.at("name"))
      bases[v.at("name")] = v.at("template");
  for (const auto& v : fixture.at("variants")) {
    const std::string name = v.at("name");
    std::string tmpl;
    if (v.contains("template")) {
      tmpl = v.at("template");
    } else {
      const auto& sp = v.at("splice");
      tmpl = bases.at(v.at("base"));
      tmpl.replace(sp[0].get<size_t>(), sp[1].get<size_t>() - sp[0].get<size_t>(), sp[2].get<std::string>());
    }
    test::TempDir dir;
    const std::string tok_dir = test::fixture(v.at("tokenizer").get<std::string>());
    std::filesystem::copy_file(tok_dir + "/tokenizer.json", dir / "tokenizer.json");
    auto config = nlohmann::json::parse(read_text_file(tok_dir + "/tokenizer_config.json"));
    config["chat_template"] = tmpl;
    test::write_text(dir / "tokenizer_config.json", config.dump());
    Tokenizer tok(dir.path);
    ChatFormat format;
    try {
      format = chat_format(tok, ChatTemplate::automatic);
    } catch (const RuntimeError& e) {
      ++refused;
      std::string why = e.what();  // "FILE: ...; closest: line N: the literal "X" is not in ...": "the literal"
      const size_t closest = why.find("closest: ");
      why = closest == std::string::npos ? why.substr(why.find(": ") + 2) : why.substr(closest + 9);
      if (why.rfind("line ", 0) == 0) why = why.substr(why.find(": ") + 2);
      why = why.substr(0, why.find_first_of("\"("));
      ++refusals[why];
      EXPECT_FALSE(v.at("must_read").get<bool>()) << name << " refused: " << e.what();
      continue;
    }
    ++read;
    if (format.kind == ChatTemplate::llama3_2) format.date = fixture.at("date");  // strftime_now's, as rendered
    const auto& renders = v.at("renders");  // for each chat, without then with the generation prompt
    ASSERT_EQ(renders.size(), 2 * chats.size()) << name;
    for (size_t k = 0; k < renders.size(); ++k) {
      const auto& r = renders[k];
      const size_t chat = k / 2;
      const auto& messages = chats.at(chat);
      const bool prompt = k % 2 == 1;
      std::vector<int32_t> ids;
      try {
        ids = prompt ? render_prompt(tok, format, messages) : render_chat(tok, format, messages, false).ids;
      } catch (const RuntimeError&) {
        both_refuse += r.is_string() ? 1 : 0;
        continue;  // ptrain may refuse a chat
      }
      if (r.is_string()) {  // the error transformers raised
        ADD_FAILURE() << name << ": chat " << chat << (prompt ? " + prompt" : "") << " rendered, but "
                      << "transformers refuses it: " << r.get<std::string>();
        continue;
      }
      ++compared;
      EXPECT_EQ(ids, fixture.at("ids").at(r.get<size_t>()).get<std::vector<int32_t>>())
          << name << " (read as " << chat_template_names()[static_cast<size_t>(format.kind)] << "): chat " << chat
          << (prompt ? " + prompt" : "");
    }
    if (!v.contains("tool_renders")) continue;
    // chats with tools (JSONL records): rendered as transformers renders them, or refused
    const auto& tool_renders = v.at("tool_renders");
    ASSERT_EQ(tool_renders.size(), fixture.at("tool_records").size()) << name;
    for (size_t k = 0; k < tool_renders.size(); ++k) {
      const auto& r = tool_renders[k];
      std::vector<int32_t> ids;
      try {
        SampleStats stats;
        ids = render_record(tok, format, {}, fixture.at("tool_records")[k].get<std::string>(), false, stats).ids;
      } catch (const RuntimeError&) {
        ++tools_refused;
        continue;
      }
      if (r.is_string()) {
        ADD_FAILURE() << name << ": tool record " << k << " rendered, but transformers refuses it: " << r;
        continue;
      }
      ++tools_compared;
      tools_read.insert(name);
      EXPECT_EQ(ids, fixture.at("ids").at(r.get<size_t>()).get<std::vector<int32_t>>())
          << name << ": tool record " << k;
    }
  }
  // the released templates' tool branches are read
  for (const char* released : {"qwen2.5 released", "qwen2 released", "qwen3 first release", "llama3.1 released",
                               "llama3.2 released", "mistral nemo"})
    EXPECT_TRUE(tools_read.count(released)) << released;
  std::cout << fixture.at("variants").size() << " template variants: " << read << " read, each render equal to "
            << "transformers' (" << compared << " renders compared, " << both_refuse
            << " refused by both); chats with tools: " << tools_compared << " renders equal (" << tools_read.size()
            << " variants), " << tools_refused << " refused; " << refused << " refused:\n";
  for (const auto& [why, n] : refusals) std::cout << "  " << n << " x " << why << "\n";
}
