#include "data/tokenizer.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <climits>
#include <filesystem>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <unordered_map>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// UTF-8 encoding of one code point.
std::string utf8(uint32_t cp) {
  std::string s;
  if (cp < 0x80) {
    s += static_cast<char>(cp);
  } else if (cp < 0x800) {
    s += static_cast<char>(0xC0 | (cp >> 6));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    s += static_cast<char>(0xE0 | (cp >> 12));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  } else {
    s += static_cast<char>(0xF0 | (cp >> 18));
    s += static_cast<char>(0x80 | ((cp >> 12) & 0x3F));
    s += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
    s += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return s;
}

// Length of the UTF-8 sequence starting with byte c (1 for a stray continuation byte).
size_t utf8_length(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

// The byte-level alphabet (GPT-2's bytes_to_unicode): printable bytes stand for themselves,
// the other 68 are shifted to code points 256 and up, so every byte is one visible character.
struct ByteLevel {
  std::string of_byte[256];                          // byte -> its character, UTF-8
  std::unordered_map<std::string, uint8_t> byte_of;  // and back
  ByteLevel() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      of_byte[b] = utf8(printable ? static_cast<uint32_t>(b) : next++);
      byte_of[of_byte[b]] = static_cast<uint8_t>(b);
    }
  }
};
const ByteLevel& byte_level() {
  static const ByteLevel b;
  return b;
}

struct Pcre2Code {
  pcre2_code* code = nullptr;
  ~Pcre2Code() {
    if (code) pcre2_code_free(code);
  }
};

}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::unordered_map<std::string, int32_t> vocab;
  std::unordered_map<int32_t, std::string> token_of;    // id -> vocabulary string (byte-level)
  std::unordered_map<std::string, int32_t> merge_rank;  // "left\nright" -> rank
  bool ignore_merges = false;
  struct Added {
    std::string content;
    int32_t id;
  };
  std::vector<Added> added;                           // longest first
  bool starts_added[256] = {};                        // a byte some added token starts with
  std::unordered_map<int32_t, std::string> added_of;  // id -> content
  Pcre2Code split;
  int32_t max_id = -1;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;  // piece -> ids

  [[noreturn]] void fail(const std::string& what) const { throw RuntimeError(path + ": " + what); }

  void bpe(const std::string& piece, std::vector<int32_t>& out) const {
    auto hit = cache.find(piece);
    if (hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    const ByteLevel& bl = byte_level();
    std::string mapped;
    for (unsigned char c : piece) mapped += bl.of_byte[c];
    std::vector<int32_t> ids;
    auto whole = vocab.find(mapped);
    if (ignore_merges && whole != vocab.end()) {
      ids.push_back(whole->second);
    } else {
      std::vector<std::string> symbols;
      for (unsigned char c : piece) symbols.push_back(bl.of_byte[c]);
      // Merge the lowest-ranked adjacent pair everywhere it occurs, left to right, until no
      // pair has a rank. (A merge only creates pairs of later rank, so this is the same order
      // as one merge at a time by (rank, position).)
      while (symbols.size() > 1) {
        int best = INT_MAX;
        for (size_t i = 0; i + 1 < symbols.size(); ++i) {
          auto r = merge_rank.find(symbols[i] + '\n' + symbols[i + 1]);
          if (r != merge_rank.end()) best = std::min(best, r->second);
        }
        if (best == INT_MAX) break;
        std::vector<std::string> merged;
        for (size_t i = 0; i < symbols.size(); ++i) {
          if (i + 1 < symbols.size()) {
            auto r = merge_rank.find(symbols[i] + '\n' + symbols[i + 1]);
            if (r != merge_rank.end() && r->second == best) {
              merged.push_back(symbols[i] + symbols[i + 1]);
              ++i;
              continue;
            }
          }
          merged.push_back(symbols[i]);
        }
        symbols.swap(merged);
      }
      for (const auto& s : symbols) {
        auto id = vocab.find(s);
        if (id == vocab.end())
          fail("the vocabulary has no token '" + s + "' (a byte-level BPE vocabulary holds all 256 bytes)");
        ids.push_back(id->second);
      }
    }
    if (cache.size() > (1u << 20)) cache.clear();
    cache.emplace(piece, ids);
    out.insert(out.end(), ids.begin(), ids.end());
  }

  // Pre-tokenizes ordinary text (no added tokens in it): the split regex's matches and the
  // text between them, each piece through BPE.
  void encode_plain(const std::string& text, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    pcre2_match_data* md = pcre2_match_data_create_from_pattern(split.code, nullptr);
    const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
    size_t pos = 0, last = 0;
    while (pos < text.size()) {
      const int rc = pcre2_match(split.code, subject, text.size(), pos, pos == 0 ? 0 : PCRE2_NO_UTF_CHECK, md, nullptr);
      if (rc == PCRE2_ERROR_NOMATCH) break;
      if (rc < 0) {
        pcre2_match_data_free(md);
        PCRE2_UCHAR msg[256];
        pcre2_get_error_message(rc, msg, sizeof msg);
        throw RuntimeError("tokenizing text (at byte " + std::to_string(pos) +
                           "): " + reinterpret_cast<const char*>(msg));
      }
      const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
      const size_t begin = ov[0], end = ov[1];
      if (begin > last) bpe(text.substr(last, begin - last), out);  // text no alternative matched
      if (end > begin) {
        bpe(text.substr(begin, end - begin), out);
        pos = last = end;
      } else {  // an empty match: step over one character
        pos = begin + utf8_length(static_cast<unsigned char>(text[begin]));
      }
    }
    if (last < text.size()) bpe(text.substr(last), out);
    pcre2_match_data_free(md);
  }
};

Tokenizer::Tokenizer(const std::string& path_in) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.path = fs::is_directory(path_in) ? (fs::path(path_in) / "tokenizer.json").string() : path_in;
  if (!fs::is_regular_file(m.path))
    throw RuntimeError("no tokenizer file '" + m.path + "' (pass a tokenizer.json or an HF model directory)");
  json j;
  try {
    j = json::parse(read_text_file(m.path));
  } catch (const json::exception& e) {
    m.fail(std::string("not valid JSON: ") + e.what());
  }
  try {
    const json& model = j.at("model");
    const std::string type = model.value("type", "");
    if (type != "BPE")
      m.fail("tokenizer model type '" + type +
             "' is not supported; ptrain reads byte-level BPE tokenizers (Llama 3 family)");
    auto present = [](const json& o, const char* key) { return o.contains(key) && !o.at(key).is_null(); };
    if (present(j, "normalizer"))
      m.fail("normalizer '" + j.at("normalizer").value("type", "?") + "' is not supported (byte-level BPE has none)");
    if (model.value("byte_fallback", false)) m.fail("byte_fallback BPE (sentencepiece-style) is not supported");
    if (present(model, "continuing_subword_prefix") || present(model, "end_of_word_suffix"))
      m.fail("continuing_subword_prefix / end_of_word_suffix are not supported");
    m.ignore_merges = model.value("ignore_merges", false);
    for (const auto& [token, id] : model.at("vocab").items()) {
      const int32_t i = id.get<int32_t>();
      m.vocab[token] = i;
      m.token_of[i] = token;
      m.max_id = std::max(m.max_id, i);
    }
    int rank = 0;
    for (const auto& merge : model.at("merges")) {
      std::string left, right;
      if (merge.is_array()) {
        left = merge.at(0).get<std::string>();
        right = merge.at(1).get<std::string>();
      } else {
        const std::string s = merge.get<std::string>();
        const auto space = s.find(' ');
        if (space == std::string::npos) m.fail("merge '" + s + "' is not 'left right'");
        left = s.substr(0, space);
        right = s.substr(space + 1);
      }
      m.merge_rank.emplace(left + '\n' + right, rank++);
    }
    // Pre-tokenizer: Split(regex, Isolated) then ByteLevel(use_regex = false), as Llama 3.
    const json& pre = j.at("pre_tokenizer");
    std::vector<json> steps;
    if (pre.value("type", "") == "Sequence")
      for (const auto& p : pre.at("pretokenizers")) steps.push_back(p);
    else
      steps.push_back(pre);
    std::string pattern;
    bool byte_level_seen = false;
    for (const auto& p : steps) {
      const std::string t = p.value("type", "");
      if (t == "Split") {
        if (!pattern.empty()) m.fail("more than one Split pre-tokenizer is not supported");
        if (!p.at("pattern").contains("Regex")) m.fail("a Split pre-tokenizer on a plain string is not supported");
        pattern = p.at("pattern").at("Regex").get<std::string>();
        if (p.value("behavior", "") != "Isolated" || p.value("invert", false))
          m.fail("Split behavior '" + p.value("behavior", "") + "' is not supported (Isolated)");
      } else if (t == "ByteLevel") {
        if (p.value("use_regex", true))
          m.fail("ByteLevel with its own GPT-2 regex is not supported (Llama 3 uses Split + ByteLevel)");
        if (p.value("add_prefix_space", false)) m.fail("ByteLevel add_prefix_space is not supported");
        byte_level_seen = true;
      } else {
        m.fail("pre-tokenizer '" + t + "' is not supported (Split + ByteLevel, as Llama 3)");
      }
    }
    if (pattern.empty() || !byte_level_seen) m.fail("the pre-tokenizer must be Split(regex) + ByteLevel (Llama 3's)");
    int err = 0;
    PCRE2_SIZE offset = 0;
    m.split.code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(), PCRE2_UTF | PCRE2_UCP,
                                 &err, &offset, nullptr);
    if (!m.split.code) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      m.fail("the split regex does not compile at offset " + std::to_string(offset) + ": " +
             reinterpret_cast<const char*>(msg));
    }
    pcre2_jit_compile(m.split.code, PCRE2_JIT_COMPLETE);  // best effort: the interpreter gives the same matches
    for (const auto& a : j.value("added_tokens", json::array())) {
      if (a.value("lstrip", false) || a.value("rstrip", false) || a.value("single_word", false))
        m.fail("added token '" + a.value("content", "") + "' uses lstrip/rstrip/single_word, which is not supported");
      Impl::Added t{a.at("content").get<std::string>(), a.at("id").get<int32_t>()};
      if (t.content.empty()) m.fail("an added token is empty");
      m.added_of[t.id] = t.content;
      m.starts_added[static_cast<unsigned char>(t.content[0])] = true;
      m.max_id = std::max(m.max_id, t.id);
      m.added.push_back(std::move(t));
    }
    std::stable_sort(m.added.begin(), m.added.end(),
                     [](const Impl::Added& a, const Impl::Added& b) { return a.content.size() > b.content.size(); });
  } catch (const json::exception& e) {
    m.fail(std::string("malformed tokenizer.json: ") + e.what());
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode(const std::string& text) const {
  const Impl& m = *impl_;
  std::vector<int32_t> out;
  size_t plain = 0;  // start of the ordinary text not yet encoded
  for (size_t i = 0; i < text.size();) {
    const Impl::Added* hit = nullptr;
    if (m.starts_added[static_cast<unsigned char>(text[i])]) {
      for (const auto& a : m.added) {  // longest first: the leftmost-longest added token
        if (text.compare(i, a.content.size(), a.content) == 0) {
          hit = &a;
          break;
        }
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    m.encode_plain(text.substr(plain, i - plain), out);
    out.push_back(hit->id);
    i += hit->content.size();
    plain = i;
  }
  m.encode_plain(text.substr(plain), out);
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  const ByteLevel& bl = byte_level();
  std::string out;
  for (int32_t id : ids) {
    auto a = m.added_of.find(id);
    if (a != m.added_of.end()) {
      out += a->second;
      continue;
    }
    auto t = m.token_of.find(id);
    if (t == m.token_of.end())
      throw RuntimeError("token id " + std::to_string(id) + " is not in the vocabulary of " + m.path);
    const std::string& s = t->second;
    for (size_t i = 0; i < s.size();) {
      const size_t n = utf8_length(static_cast<unsigned char>(s[i]));
      auto b = bl.byte_of.find(s.substr(i, n));
      if (b == bl.byte_of.end())
        throw RuntimeError("token " + std::to_string(id) + " of " + m.path + " is not byte-level");
      out += static_cast<char>(b->second);
      i += n;
    }
  }
  return out;
}

std::optional<int32_t> Tokenizer::id_of(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto v = impl_->vocab.find(token);
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

std::vector<uint32_t> tokenize_file(const Tokenizer& tokenizer, const std::string& path, bool jsonl,
                                    int32_t end_of_document,
                                    const std::function<void(int64_t, int64_t, int64_t)>& progress,
                                    size_t chunk_bytes) {
  const std::string data = read_text_file(path);
  const auto total = static_cast<int64_t>(data.size());
  std::vector<uint32_t> out;
  auto append = [&](const std::vector<int32_t>& ids) { out.insert(out.end(), ids.begin(), ids.end()); };
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  size_t pos = 0;
  int64_t line = 0;
  while (pos < data.size()) {
    size_t end = data.size();
    if (jsonl) {
      end = data.find('\n', pos);
      end = end == std::string::npos ? data.size() : end + 1;
      ++line;
      const std::string record = data.substr(pos, end - pos);
      if (record.find_first_not_of(" \t\r\n") != std::string::npos) {
        std::string text;
        try {
          const json j = json::parse(record);
          if (j.is_object() && (j.contains("messages") || j.contains("prompt")))
            throw RuntimeError(path + ":" + std::to_string(line) +
                               ": a chat or prompt/completion record has a loss mask, which a token file cannot hold; "
                               "train on the JSONL file itself (data.format = \"jsonl\")");
          if (!j.is_object() || !j.contains("text") || !j.at("text").is_string())
            throw RuntimeError(path + ":" + std::to_string(line) + ": a JSONL record needs a string field \"text\"");
          text = j.at("text").get<std::string>();
        } catch (const json::exception& e) {
          throw RuntimeError(path + ":" + std::to_string(line) + ": not valid JSON (" + e.what() + ")");
        }
        append(tokenizer.encode(text));
        if (end_of_document >= 0) out.push_back(static_cast<uint32_t>(end_of_document));
      }
    } else if (data.size() - pos > chunk_bytes) {
      // The first newline after chunk_bytes that a non-space follows (else the rest).
      for (size_t i = pos + chunk_bytes; i + 1 < data.size(); ++i)
        if (data[i] == '\n' && !is_space(data[i + 1])) {
          end = i + 1;
          break;
        }
      append(tokenizer.encode(data.substr(pos, end - pos)));
    } else {
      append(tokenizer.encode(data.substr(pos)));
    }
    pos = end;
    if (progress && (!jsonl || line % 1000 == 0 || pos == data.size()))
      progress(static_cast<int64_t>(pos), total, static_cast<int64_t>(out.size()));
  }
  return out;
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->max_id) + 1; }
const std::string& Tokenizer::path() const { return impl_->path; }

}  // namespace ptrain
