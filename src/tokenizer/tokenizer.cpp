#include "tokenizer/tokenizer.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <queue>
#include <thread>
#include <unordered_map>
#include <unordered_set>

#include "checkpoint/hf_config_file.h"
#include "common/error.h"
#include "common/fs_util.h"
#include "common/regex.h"
#include "common/utf8.h"
#include "tokenizer/byte_level.h"
#include "tokenizer/gguf_tokenizer.h"
#include "tokenizer/tokenizer_dir.h"
#include "tokenizer/tokenizer_shape.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// ---- UTF-8 ----------------------------------------------------------------------------------

// Length of the UTF-8 sequence starting with byte c (1 for a stray continuation byte).
size_t utf8_length(unsigned char c) {
  return c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xE ? 3 : (c >> 3) == 0x1E ? 4 : 1;
}

// The length of the valid UTF-8 sequence at s[i] (0 when there is none: an invalid byte).
size_t valid_sequence(const std::string& s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  const size_t n = s.size();
  if (c < 0x80) return 1;
  auto cont = [&](size_t k) { return k < n && (b(k) & 0xC0) == 0x80; };
  if (c >= 0xC2 && c <= 0xDF) return cont(i + 1) ? 2 : 0;
  if (c >= 0xE0 && c <= 0xEF) {
    if (i + 1 >= n) return 0;
    const unsigned char lo = c == 0xE0 ? 0xA0 : 0x80, hi = c == 0xED ? 0x9F : 0xBF;
    if (b(i + 1) < lo || b(i + 1) > hi) return 0;
    return cont(i + 2) ? 3 : 0;
  }
  if (c >= 0xF0 && c <= 0xF4) {
    if (i + 1 >= n) return 0;
    const unsigned char lo = c == 0xF0 ? 0x90 : 0x80, hi = c == 0xF4 ? 0x8F : 0xBF;
    if (b(i + 1) < lo || b(i + 1) > hi) return 0;
    return cont(i + 2) && cont(i + 3) ? 4 : 0;
  }
  return 0;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const size_t n = valid_sequence(s, i);
    if (!n) return false;
    i += n;
  }
  return true;
}

// Bytes to text the way Rust's String::from_utf8_lossy does it: each maximal invalid prefix of
// a sequence becomes one U+FFFD.
std::string lossy_utf8(const std::string& bytes) {
  std::string out;
  for (size_t i = 0; i < bytes.size();) {
    const size_t n = valid_sequence(bytes, i);
    if (n) {
      out.append(bytes, i, n);
      i += n;
      continue;
    }
    // The longest prefix of a valid sequence starting here, consumed as one replacement.
    size_t k = 1;
    const size_t want = utf8_length(static_cast<unsigned char>(bytes[i]));
    while (want > 1 && k < want && i + k < bytes.size()) {
      std::string probe = bytes.substr(i, k + 1) + std::string(want - k - 1, '\x80');
      if (!valid_sequence(probe, 0)) break;
      ++k;
    }
    out += "\xEF\xBF\xBD";
    i += k;
  }
  return out;
}

uint32_t code_point(const std::string& s, size_t i, size_t n) {
  const auto c = static_cast<unsigned char>(s[i]);
  uint32_t cp = n == 1 ? c : n == 2 ? c & 0x1F : n == 3 ? c & 0x0F : c & 0x07;
  for (size_t k = 1; k < n; ++k) cp = (cp << 6) | (static_cast<unsigned char>(s[i + k]) & 0x3F);
  return cp;
}

// Unicode White_Space (Rust's char::is_whitespace), for added tokens' lstrip / rstrip.
bool is_whitespace(uint32_t cp) {
  return (cp >= 0x9 && cp <= 0xD) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// ---- the byte-level alphabet -------------------------------------------------------------------

// GPT-2's pre-tokenizer regex, which ByteLevel(use_regex = true) splits with.
constexpr const char* kGpt2Split = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";

// The matches of `re` in `text`; an empty one is refused: HF and ptrain step over an empty match
// differently, so a pattern that can match nothing is read only where it never does.
std::vector<std::pair<size_t, size_t>> nonempty_matches(const Regex& re, const std::string& text) {
  bool empty = false;
  auto matches = re.matches(text, &empty);
  if (empty)
    throw RuntimeError("the regex '" + re.pattern() +
                       "' matches the empty string in this text, where ptrain could split or replace otherwise than "
                       "HF tokenizers");
  return matches;
}

// Splits `text` into the regex's matches and the text between them (Split, behavior Isolated).
std::vector<std::string> split_isolated(const Regex& re, const std::string& text) {
  std::vector<std::string> out;
  size_t last = 0;
  for (const auto& [b, e] : nonempty_matches(re, text)) {
    if (b > last) out.push_back(text.substr(last, b - last));
    out.push_back(text.substr(b, e - b));
    last = e;
  }
  if (last < text.size()) out.push_back(text.substr(last));
  return out;
}

std::string replace_all(const std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return s;
  std::string out;
  size_t pos = 0;
  for (size_t hit; (hit = s.find(from, pos)) != std::string::npos; pos = hit + from.size())
    out += s.substr(pos, hit - pos) + to;
  return out + s.substr(pos);
}

// The split regexes classify characters as letters, numbers, separators or other with PCRE2's
// Unicode tables (Debian's PCRE2: Unicode 14); HF tokenizers uses newer ones. A character the two
// would class differently — one PCRE2 does not know (assigned later: CJK extension H, new Latin
// letters, ...), or one unassigned in utf8proc's Unicode 15 tables too (Unicode 16 and later),
// which HF may know — could split where HF's does not. Such characters are refused, naming them.
// Classes are worked out once per code point, on first sight.
class UnicodeClasses {
 public:
  // "" when `cp` classes alike in PCRE2 and utf8proc, else why not.
  std::string check(uint32_t cp) {
    if (cp < 0x80 || cp >= state_.size()) return "";
    uint8_t st = state_[cp].load(std::memory_order_relaxed);
    if (st == 0) {
      st = classify(cp) ? 1 : 2;
      state_[cp].store(st, std::memory_order_relaxed);
    }
    if (st == 1) return "";
    char buf[16];
    std::snprintf(buf, sizeof buf, "U+%04X", cp);
    return std::string(buf) + (utf8proc_category(static_cast<int32_t>(cp)) == UTF8PROC_CATEGORY_CN
                                   ? " is unassigned in this build's Unicode 15 tables (utf8proc)"
                                   : " is not in this build's PCRE2 Unicode tables (older than utf8proc's Unicode 15)");
  }

 private:
  bool classify(uint32_t cp) {
    const int cat = utf8proc_category(static_cast<int32_t>(cp));
    if (cat == UTF8PROC_CATEGORY_CN) return false;
    const bool letter = cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO;
    const bool number = cat >= UTF8PROC_CATEGORY_ND && cat <= UTF8PROC_CATEGORY_NO;
    const bool separator = cat >= UTF8PROC_CATEGORY_ZS && cat <= UTF8PROC_CATEGORY_ZP;
    const std::string c = utf8(cp);
    return letter == matches(letter_, c) && number == matches(number_, c) && separator == matches(separator_, c);
  }
  bool matches(const Regex& re, const std::string& c) { return !re.matches(c).empty(); }
  static void fail(const std::string& what) { throw RuntimeError(what); }
  Regex letter_{"^\\p{L}$", fail}, number_{"^\\p{N}$", fail}, separator_{"^\\p{Z}$", fail};
  std::vector<std::atomic<uint8_t>> state_ = std::vector<std::atomic<uint8_t>>(0x110000);  // 0 unknown, 1 alike, 2 not
};

UnicodeClasses& unicode_classes() {
  static UnicodeClasses c;
  return c;
}

}  // namespace

// ---- the tokenizer ----------------------------------------------------------------------------

namespace {
uint64_t next_instance() {
  static std::atomic<uint64_t> n{0};
  return ++n;
}

// Each thread's cache of piece -> ids, for the tokenizer it last used (encode is called from
// several threads at once by tokenize_file).
std::unordered_map<std::string, std::vector<int32_t>>& piece_cache(uint64_t instance) {
  thread_local uint64_t owner = 0;
  thread_local std::unordered_map<std::string, std::vector<int32_t>> cache;
  if (owner != instance) {
    cache.clear();
    owner = instance;
  }
  return cache;
}
}  // namespace

struct Tokenizer::Impl {
  std::string path;
  std::string reading;  // how the files were read: the class transformers uses, or the file as written
  std::optional<std::pair<std::string, std::string>> template_tokens;  // a directory's bos_token / eos_token
  std::optional<std::string> embedded_chat_template;                   // a GGUF file's tokenizer.chat_template
  uint64_t source_bytes = UINT64_MAX;  // the part of `path` the tokenizer is read from (a GGUF file's header)
  [[noreturn]] void fail(const std::string& what) const { throw RuntimeError(path + ": " + what); }
  std::function<void(const std::string&)> failer() const;  // fail(), for readers that take a callback
  // A token id as tokenizer.json writes it: an integer in [0, 2^24) — a float, a negative or a
  // huge id (which would size the id table) is refused.
  int32_t token_id(const json& v, const std::string& token) const {
    constexpr int64_t kLimit = int64_t{1} << 24;
    const bool ok = v.is_number_unsigned()  ? v.get<uint64_t>() < static_cast<uint64_t>(kLimit)
                    : v.is_number_integer() ? v.get<int64_t>() >= 0 && v.get<int64_t>() < kLimit
                                            : false;
    if (!ok) fail("token '" + token + "' has id " + v.dump() + ", not an integer in [0, 16777216)");
    return static_cast<int32_t>(v.get<int64_t>());
  }

  // Normalizer steps, in order.
  struct NormStep {
    enum Kind { nfc, nfd, nfkc, nfkd, lowercase, prepend, replace } kind;
    std::string text, content;       // prepend: text; replace: pattern (string) -> content
    std::shared_ptr<Regex> pattern;  // replace with a regex pattern
  };
  std::vector<NormStep> normalizer;

  // Pre-tokenizer steps, in order.
  struct PreStep {
    enum Kind { split, byte_level, metaspace } kind;
    std::shared_ptr<Regex> regex;  // split; byte_level with use_regex
    std::string replacement;       // metaspace
    enum Prepend { always, first, never } prepend = always;
    bool split_words = true;  // metaspace: split before each replacement
  };
  std::vector<PreStep> pre;
  // The post-processor's special tokens around a single text; what it holds that is not read.
  std::vector<int32_t> special_prefix, special_suffix;
  std::string post_unsupported;
  bool classes_by_regex = false;  // a pre-tokenizer regex classes characters with Unicode properties

  // BPE.
  std::unordered_map<std::string, int32_t> vocab;
  std::vector<std::string> token_of;                                 // by id ("" where only an added token has the id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges;  // (left id, right id) -> (rank, merged id)
  bool ignore_merges = false, byte_fallback = false, fuse_unk = false;
  int32_t unk = -1;
  int32_t byte_id[256];                 // byte_fallback: the id of "<0xNN>"
  uint64_t instance = next_instance();  // keys this tokenizer's piece cache in each thread
  // Where a long piece may be cut with its ids unchanged (index_cuts): between two characters that
  // no merge can join. SentencePiece-style tokenizers hand BPE a whole text as one piece.
  std::vector<bool> alone;              // code points that are a vocabulary token by themselves
  std::unordered_set<uint64_t> joined;  // (code point, next code point) side by side in some token
  bool bytes_merge = false;             // some merge has a <0xNN> byte token as a side
  enum class LineCuts { never, at_lines, where_bpe_may } line_cuts = LineCuts::never;  // read_line_cuts
  std::vector<std::string> line_ends;  // at_lines: the runs of spaces a part may end with (probe_line_ends)

  // Decoder steps, in order, over the list of token strings.
  struct DecStep {
    enum Kind { byte_level, metaspace, replace, byte_fallback, fuse, strip } kind;
    std::string from, to;  // replace; metaspace: from = replacement
    bool prepend = true;   // metaspace: the first token's leading replacement is dropped
    std::string strip_content;
    int64_t start = 0, stop = 0;
  };
  std::vector<DecStep> decoder;
  bool has_decoder = false;

  struct Added {
    std::string content, normalized_content;
    int32_t id;
    bool lstrip, rstrip, normalized;
  };
  std::vector<Added> added;  // longest content first
  // The added tokens of one set (normalized or not) as a byte trie keyed by the text they match:
  // the longest token at a position in one walk no longer than the longest token, so the 257
  // added tokens of Llama 3 cost one table look-up at a byte that starts none of them.
  struct AddedTrie {
    struct Node {
      std::vector<std::pair<unsigned char, int32_t>> next;
      const Added* token = nullptr;  // the first added token whose key ends here
    };
    std::vector<Node> nodes = std::vector<Node>(1);
    std::array<bool, 256> starts{};  // bytes that begin a key
    void insert(const std::string& key, const Added* token) {
      int32_t n = 0;
      for (const char ch : key) {
        const auto b = static_cast<unsigned char>(ch);
        auto& next = nodes[static_cast<size_t>(n)].next;
        auto it = std::find_if(next.begin(), next.end(), [b](const auto& e) { return e.first == b; });
        if (it == next.end()) {
          next.emplace_back(b, static_cast<int32_t>(nodes.size()));
          n = static_cast<int32_t>(nodes.size());
          nodes.emplace_back();
        } else {
          n = it->second;
        }
      }
      if (!nodes[static_cast<size_t>(n)].token) nodes[static_cast<size_t>(n)].token = token;
      starts[static_cast<unsigned char>(key[0])] = true;
    }
    // The longest key that `s` holds at `i`, or null.
    const Added* longest(const std::string& s, size_t i) const {
      if (!starts[static_cast<unsigned char>(s[i])]) return nullptr;
      const Added* hit = nullptr;
      for (int32_t n = 0; i < s.size(); ++i) {
        const auto& next = nodes[static_cast<size_t>(n)].next;
        const auto b = static_cast<unsigned char>(s[i]);
        auto it = std::find_if(next.begin(), next.end(), [b](const auto& e) { return e.first == b; });
        if (it == next.end()) break;
        n = it->second;
        if (nodes[static_cast<size_t>(n)].token) hit = nodes[static_cast<size_t>(n)].token;
      }
      return hit;
    }
  };
  AddedTrie raw_added, normalized_added;  // built once `added` is complete (they point into it)
  std::unordered_map<int32_t, std::string> added_of;
  int32_t max_id = -1;

  // Reading tokenizer.json, one part each (Tokenizer's constructor runs them in order): the
  // file itself (parsed, its shape checked, a directory's other files read), then each part of
  // the pipeline as HF tokenizers reads it, refused by name where ptrain does not implement it.
  json open(const std::string& path_in);
  void read_model_options(const json& model);
  void read_normalizer(const json& j);
  void read_pre_tokenizer(const json& j);
  void read_vocab(const json& model);
  void read_merges(const json& model);
  void index_cuts();
  void read_line_cuts();
  void probe_line_ends();
  void read_decoder(const json& j);
  void read_added_tokens(const json& j);
  void read_post_processor(const json& j);
  PreStep pre_step(const json& step) const;
  DecStep decoder_step(const json& step) const;
  // One decoder step over the token strings.
  static std::vector<std::string> decode_step(const DecStep& step, const std::vector<std::string>& tokens);
  std::shared_ptr<Regex> pattern_of(const json& p, std::string& text) const;
  std::string metaspace_scheme(const json& step) const;

  static uint64_t pair_key(int32_t a, int32_t b) {
    return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
  }

  std::string normalize(std::string s) const {
    for (const auto& step : normalizer) {
      switch (step.kind) {
        case NormStep::nfc:
        case NormStep::nfd:
        case NormStep::nfkc:
        case NormStep::nfkd: {
          int options = UTF8PROC_STABLE;
          options |= step.kind == NormStep::nfc || step.kind == NormStep::nfkc ? UTF8PROC_COMPOSE : UTF8PROC_DECOMPOSE;
          if (step.kind == NormStep::nfkc || step.kind == NormStep::nfkd) options |= UTF8PROC_COMPAT;
          utf8proc_uint8_t* out = nullptr;
          const utf8proc_ssize_t n =
              utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                           &out, static_cast<utf8proc_option_t>(options));
          if (n < 0) throw RuntimeError(std::string("unicode normalization failed: ") + utf8proc_errmsg(n));
          s.assign(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
          std::free(out);
          break;
        }
        case NormStep::lowercase: {
          std::string out;
          for (size_t i = 0; i < s.size();) {
            const size_t n = utf8_length(static_cast<unsigned char>(s[i]));
            const uint32_t cp = code_point(s, i, n);
            // Rust's char::to_lowercase; U+0130 is the one character it maps to two.
            out += cp == 0x130 ? std::string("i\xCC\x87")
                               : utf8(static_cast<uint32_t>(utf8proc_tolower(static_cast<int32_t>(cp))));
            i += n;
          }
          s.swap(out);
          break;
        }
        case NormStep::prepend:
          if (!s.empty()) s = step.text + s;
          break;
        case NormStep::replace:
          if (step.pattern) {
            std::string out;
            size_t last = 0;
            for (const auto& [b, e] : nonempty_matches(*step.pattern, s))
              out += s.substr(last, b - last) + step.content, last = e;
            s = out + s.substr(last);
          } else {
            s = replace_all(s, step.text, step.content);
          }
          break;
      }
    }
    return s;
  }

  // The pieces BPE sees; `at_start`: this text begins the whole input (Metaspace's "first").
  std::vector<std::string> pre_tokenize(const std::string& text, bool at_start) const {
    std::vector<std::string> pieces{text};
    for (const auto& step : pre) {
      std::vector<std::string> next;
      for (size_t p = 0; p < pieces.size(); ++p) {
        const std::string& piece = pieces[p];
        switch (step.kind) {
          case PreStep::split:
            for (auto& s : split_isolated(*step.regex, piece)) next.push_back(std::move(s));
            break;
          case PreStep::byte_level: {
            const ByteLevelMap& bl = byte_level();
            for (const auto& s : step.regex ? split_isolated(*step.regex, piece) : std::vector<std::string>{piece}) {
              std::string mapped;
              for (unsigned char c : s) mapped += bl.of_byte[c];
              next.push_back(std::move(mapped));
            }
            break;
          }
          case PreStep::metaspace: {
            std::string s = replace_all(piece, " ", step.replacement);
            const bool prepend =
                step.prepend == PreStep::always || (step.prepend == PreStep::first && at_start && p == 0);
            if (prepend && s.compare(0, step.replacement.size(), step.replacement) != 0) s = step.replacement + s;
            if (!step.split_words) {
              next.push_back(std::move(s));
              break;
            }
            size_t begin = 0;  // each piece starts at a replacement (MergedWithNext)
            for (size_t hit; (hit = s.find(step.replacement, begin + 1)) != std::string::npos && begin < s.size();
                 begin = hit)
              if (hit > begin) next.push_back(s.substr(begin, hit - begin));
            if (begin < s.size()) next.push_back(s.substr(begin));
            break;
          }
        }
      }
      pieces.swap(next);
    }
    return pieces;
  }

  // Whether byte fallback spells the character s[i, i + n) as <0xNN> byte tokens.
  bool spelled_in_bytes(const std::string& s, size_t i, size_t n) const {
    return byte_fallback &&
           std::all_of(s.begin() + static_cast<std::ptrdiff_t>(i), s.begin() + static_cast<std::ptrdiff_t>(i + n),
                       [&](char c) { return byte_id[static_cast<unsigned char>(c)] >= 0; });
  }

  // How a character meets a cut: as a token by itself, as <0xNN> byte tokens, or neither (the
  // unknown token, whose runs fuse_unk fuses: never cut beside it).
  enum class Edge { token, bytes, none };
  Edge edge(const std::string& s, size_t i, size_t n, uint32_t cp) const {
    if (cp < alone.size() && alone[cp]) return Edge::token;
    return spelled_in_bytes(s, i, n) ? Edge::bytes : Edge::none;
  }

  // Whether no merge can join character a (edge ea) with the character b after it (edge eb).
  bool may_cut(Edge ea, uint32_t a, Edge eb, uint32_t b) const {
    if (ea == Edge::none || eb == Edge::none) return false;
    return ea == Edge::token && eb == Edge::token ? !joined.count(uint64_t{a} << 32 | b) : !bytes_merge;
  }

  // A piece through BPE. A long one is cut where no merge can join the characters either side
  // (a merge's token holds both sides' text side by side, or a byte token as a side): each part
  // then merges as it would inside the whole — a merge changes only its own pair and the pairs
  // beside it, so the lowest-ranked merge of the whole is the lowest of its part — and the parts,
  // words mostly, repeat and hit the cache.
  void bpe(const std::string& piece, std::vector<int32_t>& out) const {
    constexpr size_t kLong = 64;  // bytes; shorter pieces are BPE's words already
    if (piece.size() <= kLong || ignore_merges) return bpe_part(piece, out);
    size_t begin = 0;
    uint32_t before = 0;
    Edge before_edge = Edge::none;
    for (size_t i = 0; i < piece.size();) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
      const uint32_t cp = code_point(piece, i, n);
      const Edge e = edge(piece, i, n, cp);
      if (i > begin && may_cut(before_edge, before, e, cp)) {
        bpe_part(piece.substr(begin, i - begin), out);
        begin = i;
      }
      before = cp;
      before_edge = e;
      i += n;
    }
    bpe_part(piece.substr(begin), out);
  }

  void bpe_part(const std::string& piece, std::vector<int32_t>& out) const {
    if (piece.empty()) return;
    constexpr size_t kCached = 256;  // bytes: longer pieces rarely come again
    auto& cache = piece_cache(instance);
    auto hit = cache.find(piece);
    if (hit != cache.end()) {
      out.insert(out.end(), hit->second.begin(), hit->second.end());
      return;
    }
    std::vector<int32_t> ids;
    auto whole = vocab.find(piece);
    if (ignore_merges && whole != vocab.end()) {
      ids.push_back(whole->second);
    } else {
      // The piece's characters, each its vocabulary id, else its bytes' <0xNN> tokens, else the
      // unknown token (runs of which fuse_unk fuses).
      std::vector<int32_t> syms;
      bool after_unknown = false;  // fuse_unk fuses unknown characters, not a token whose id is unk's
      for (size_t i = 0; i < piece.size();) {
        const size_t n = std::min(utf8_length(static_cast<unsigned char>(piece[i])), piece.size() - i);
        auto v = vocab.find(piece.substr(i, n));
        const bool was_after_unknown = after_unknown;
        after_unknown = false;
        if (v != vocab.end()) {
          syms.push_back(v->second);
        } else if (spelled_in_bytes(piece, i, n)) {
          for (size_t k = i; k < i + n; ++k) syms.push_back(byte_id[static_cast<unsigned char>(piece[k])]);
        } else if (unk >= 0) {
          if (!(fuse_unk && was_after_unknown)) syms.push_back(unk);
          after_unknown = true;
        } else {
          fail("the vocabulary cannot represent the character '" + piece.substr(i, n) +
               "' (no byte fallback and no unknown token)");
        }
        i += n;
      }
      merge(syms);
      ids = std::move(syms);
    }
    out.insert(out.end(), ids.begin(), ids.end());
    if (piece.size() > kCached) return;
    if (cache.size() > (1u << 20)) cache.clear();
    cache.emplace(piece, std::move(ids));
  }

  // BPE merges as HF tokenizers applies them: the pair of lowest rank first (leftmost among
  // equals), until no adjacent pair has a merge.
  void merge(std::vector<int32_t>& syms) const {
    const size_t n = syms.size();
    if (n < 2) return;
    std::vector<int32_t> prev(n), next(n);
    std::vector<char> alive(n, 1);
    for (size_t i = 0; i < n; ++i)
      prev[i] = static_cast<int32_t>(i) - 1, next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
    struct Cand {
      int32_t rank;
      int32_t pos;
      int32_t merged;
      bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
    };
    std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> queue;
    auto push = [&](int32_t pos) {
      if (pos < 0 || next[pos] < 0) return;
      auto m = merges.find(pair_key(syms[pos], syms[next[pos]]));
      if (m != merges.end()) queue.push({m->second.first, pos, m->second.second});
    };
    for (size_t i = 0; i + 1 < n; ++i) push(static_cast<int32_t>(i));
    while (!queue.empty()) {
      const Cand c = queue.top();
      queue.pop();
      if (!alive[c.pos] || next[c.pos] < 0) continue;
      const int32_t right = next[c.pos];
      auto m = merges.find(pair_key(syms[c.pos], syms[right]));
      if (m == merges.end() || m->second.second != c.merged) continue;  // stale: a side changed
      syms[c.pos] = c.merged;
      alive[right] = 0;
      next[c.pos] = next[right];
      if (next[right] >= 0) prev[next[right]] = c.pos;
      push(prev[c.pos]);
      push(c.pos);
    }
    std::vector<int32_t> out;
    for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(syms[i]);
    syms.swap(out);
  }

  // Normalized text (no added token in it) through pre-tokenizer and BPE.
  void encode_text(const std::string& text, bool at_start, std::vector<int32_t>& out) const {
    if (text.empty()) return;
    for (const auto& piece : pre_tokenize(text, at_start)) bpe(piece, out);
  }

  // Leftmost-longest added-token matches of `set` in `s` ([begin, end) with lstrip/rstrip
  // taking the whitespace beside them).
  struct Match {
    size_t begin, end;
    const Added* token;
  };
  std::vector<Match> find_added(const std::string& s, bool normalized_set) const {
    std::vector<Match> out;
    size_t floor = 0;  // where the previous match ended
    const AddedTrie& trie = normalized_set ? normalized_added : raw_added;
    for (size_t i = 0; i < s.size();) {
      const Added* hit = trie.longest(s, i);
      if (!hit) {
        ++i;
        continue;
      }
      size_t begin = i, end = i + (normalized_set ? hit->normalized_content : hit->content).size();
      if (hit->lstrip)
        while (begin > floor) {
          size_t k = begin - 1;
          while (k > floor && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
          if (!is_whitespace(code_point(s, k, begin - k))) break;
          begin = k;
        }
      if (hit->rstrip)
        while (end < s.size()) {
          const size_t n = utf8_length(static_cast<unsigned char>(s[end]));
          if (!is_whitespace(code_point(s, end, n))) break;
          end += n;
        }
      out.push_back({begin, end, hit});
      i = floor = end;
    }
    return out;
  }
};

namespace {
bool present(const json& o, const char* key) { return o.is_object() && o.contains(key) && !o.at(key).is_null(); }

// A Sequence's steps (or the one step), for normalizer / pre-tokenizer / decoder / post-processor.
// (Sequences in a Sequence run in order, as HF runs them.)
void flatten(const json& node, const char* key, std::vector<json>& out) {
  if (node.is_null()) return;
  if (node.value("type", "") != "Sequence") return out.push_back(node);
  for (const auto& s : node.at(key)) flatten(s, key, out);
}
std::vector<json> steps_of(const json& node, const char* list_key) {
  std::vector<json> steps;
  flatten(node, list_key, steps);
  return steps;
}
}  // namespace

std::function<void(const std::string&)> Tokenizer::Impl::failer() const {
  return [this](const std::string& what) { fail(what); };
}

namespace {

// No tokenizer.json: what the directory holds instead, named, and how to get one. transformers
// converts a SentencePiece or tiktoken tokenizer.model (with sentencepiece / tiktoken installed)
// and a Tekken tekken.json (with mistral-common); ptrain reads the tokenizer.json it saves.
[[noreturn]] void refuse_missing(const std::string& path_in, bool dir) {
  const fs::path json_path = dir ? fs::path(path_in) / "tokenizer.json" : fs::path(path_in);
  const std::string hint =
      "ptrain reads tokenizer.json: save one with transformers, "
      "AutoTokenizer.from_pretrained(DIR).save_pretrained(DIR)";
  if (dir && fs::is_regular_file(fs::path(path_in) / "tokenizer.model")) {
    std::ifstream in(fs::path(path_in) / "tokenizer.model", std::ios::binary);
    std::string head(64, '\0');
    in.read(head.data(), static_cast<std::streamsize>(head.size()));
    head.resize(static_cast<size_t>(in.gcount()));
    // tiktoken's format: one "<base64 token> <rank>" per line, as Meta's original Llama 3 release.
    const bool tiktoken =
        !head.empty() &&
        head.find_first_not_of("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/= \n") ==
            std::string::npos;
    throw RuntimeError(
        "no tokenizer file '" + json_path.string() + "': the directory holds tokenizer.model, " +
        (tiktoken ? "a tiktoken BPE file (as Meta's original Llama 3 checkpoints ship it, without the special tokens "
                    "the HF release's tokenizer.json holds; use that release's tokenizer.json)"
                  : "a SentencePiece model; " + hint));
  }
  if (dir && fs::is_regular_file(fs::path(path_in) / "tekken.json"))
    throw RuntimeError(
        "no tokenizer file '" + json_path.string() +
        "': the directory holds Mistral's tekken.json, which transformers reads through mistral-common; " + hint);
  throw RuntimeError("no tokenizer file '" + json_path.string() + "' (pass a tokenizer.json or an HF model directory)");
}

}  // namespace

json Tokenizer::Impl::open(const std::string& path_in) {
  const bool dir = fs::is_directory(path_in);
  path = dir ? (fs::path(path_in) / "tokenizer.json").string() : path_in;
  // A GGUF file (or a directory holding one and no tokenizer.json): its tokenizer.ggml.* as
  // transformers' GGUF loader builds the tokenizer.json, read as written.
  if (const std::string gguf = gguf_tokenizer_file(path_in); !gguf.empty()) {
    GgufTokenizer g = read_gguf_tokenizer(gguf);
    path = gguf;
    json j = json::parse(g.tokenizer_json);
    check_tokenizer_json_shape(j, failer());
    reading = std::move(g.description);
    template_tokens = std::make_pair(std::move(g.bos), std::move(g.eos));
    embedded_chat_template = std::move(g.chat_template);
    source_bytes = g.header_bytes;
    return j;
  }
  if (dir) path = hf_tokenizer_file(path_in);  // tokenizer.json, or the file fast_tokenizer_files names
  if (!fs::is_regular_file(path)) refuse_missing(path_in, dir);
  const std::string text = read_text_file(path);
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail(std::string("not valid JSON: ") + e.what());
  }
  // Every option as HF tokenizers reads it, or refused by name, before any is used.
  check_tokenizer_json_shape(j, failer());
  // A model directory is read as transformers' AutoTokenizer reads it (tokenizer_config.json,
  // config.json); a tokenizer.json file as HF tokenizers' Tokenizer.from_file does.
  if (dir) {
    TokenizerDirReading r = read_tokenizer_dir(path_in, path, text, j);
    reading = std::move(r.description);
    template_tokens = std::make_pair(std::move(r.bos_token), std::move(r.eos_token));
    return j;
  }
  reading = "tokenizer.json as written (HF tokenizers' Tokenizer.from_file)";
  // Tokenizer.from_file applies these to every encoding (cut at max_length, padded to a size):
  // ptrain cuts and pads samples itself, so a file asking for them is refused, not half-read.
  // transformers does not apply them, so a model directory is read without them (and says so).
  for (const char* key : {"truncation", "padding"})
    if (j.contains(key) && !j.at(key).is_null())
      fail(std::string("its ") + key + " " + j.at(key).dump() +
           " makes HF tokenizers cut or pad every text this file encodes, which ptrain does not do: set it to "
           "null, or pass the model directory (transformers does not apply it either)");
  return j;
}

// A Replace / Split pattern: {"String": s} or {"Regex": r}.
// An empty one matches between every two characters, where HF and ptrain could split differently.
std::shared_ptr<Regex> Tokenizer::Impl::pattern_of(const json& p, std::string& text) const {
  const std::string value = p.begin()->get<std::string>();
  if (value.empty()) fail("an empty pattern " + p.dump() + " is not supported");
  if (p.contains("Regex")) return std::make_shared<Regex>(value, failer());
  text = value;
  return nullptr;
}

// A Metaspace's prepend scheme: "always" where absent; files from before prepend_scheme say
// add_prefix_space, which HF reads only where it agrees with the scheme.
std::string Tokenizer::Impl::metaspace_scheme(const json& step) const {
  const std::string scheme = step.value("prepend_scheme", std::string("always"));
  if (scheme != "always" && scheme != "first" && scheme != "never")
    fail("Metaspace prepend_scheme '" + scheme + "' is not one HF tokenizers reads (always, first, never)");
  if (step.contains("add_prefix_space") && !step.at("add_prefix_space").get<bool>() && scheme != "never")
    fail("Metaspace add_prefix_space false with prepend_scheme '" + scheme + "': HF tokenizers refuses the pair");
  return scheme;
}

void Tokenizer::Impl::read_model_options(const json& model) {
  const std::string type = model.value("type", "");
  if (type != "BPE")
    fail("tokenizer model type '" + type +
         "' is not supported; ptrain reads BPE tokenizers (byte-level as Llama 3 "
         "and Qwen, or SentencePiece-style as Llama 2 and Mistral)");
  // An empty prefix or suffix is none (HF tokenizers reads "" and null alike; released Qwen files
  // and transformers' own converters write ""); any other is refused.
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"})
    if (present(model, key) && model.at(key) != json(""))
      fail(std::string("BPE ") + key + " " + model.at(key).dump() + " is not supported (only none or \"\")");
  if (present(model, "dropout") && model.at("dropout").get<double>() > 0)
    fail("BPE dropout changes the ids from one call to the next; it is not supported");
  ignore_merges = present(model, "ignore_merges") && model.at("ignore_merges").get<bool>();
  byte_fallback = present(model, "byte_fallback") && model.at("byte_fallback").get<bool>();
  fuse_unk = present(model, "fuse_unk") && model.at("fuse_unk").get<bool>();
}

void Tokenizer::Impl::read_normalizer(const json& j) {
  for (const auto& step : steps_of(present(j, "normalizer") ? j.at("normalizer") : json(), "normalizers")) {
    const std::string t = step.value("type", "");
    NormStep s{};
    if (t == "NFC")
      s.kind = NormStep::nfc;
    else if (t == "NFD")
      s.kind = NormStep::nfd;
    else if (t == "NFKC")
      s.kind = NormStep::nfkc;
    else if (t == "NFKD")
      s.kind = NormStep::nfkd;
    else if (t == "Lowercase")
      s.kind = NormStep::lowercase;
    else if (t == "Prepend")
      s.kind = NormStep::prepend, s.text = step.at("prepend").get<std::string>();
    else if (t == "Replace")
      s.kind = NormStep::replace, s.pattern = pattern_of(step.at("pattern"), s.text),
      s.content = step.at("content").get<std::string>();
    else
      fail("normalizer '" + t + "' is not supported (NFC, NFD, NFKC, NFKD, Lowercase, Prepend, Replace, Sequence)");
    normalizer.push_back(std::move(s));
  }
}

Tokenizer::Impl::PreStep Tokenizer::Impl::pre_step(const json& step) const {
  const std::string t = step.value("type", "");
  PreStep s{};
  if (t == "Split") {
    s.kind = PreStep::split;
    std::string literal;
    s.regex = pattern_of(step.at("pattern"), literal);
    if (!s.regex) fail("a Split pre-tokenizer on a plain string is not supported (a regex is)");
    if (step.value("behavior", "") != "Isolated" || step.value("invert", false))
      fail("Split behavior '" + step.value("behavior", "") + "'" + (step.value("invert", false) ? " inverted" : "") +
           " is not supported (Isolated)");
  } else if (t == "ByteLevel") {
    s.kind = PreStep::byte_level;
    if (step.value("add_prefix_space", false)) fail("ByteLevel add_prefix_space is not supported");
    if (step.value("use_regex", true)) s.regex = std::make_shared<Regex>(kGpt2Split, failer());
  } else if (t == "Metaspace") {
    s.kind = PreStep::metaspace;
    s.replacement = step.at("replacement").get<std::string>();
    const std::string scheme = metaspace_scheme(step);
    s.prepend = scheme == "always" ? PreStep::always : scheme == "first" ? PreStep::first : PreStep::never;
    s.split_words = !step.contains("split") || step.at("split").is_null() || step.at("split").get<bool>();
  } else {
    fail("pre-tokenizer '" + t + "' is not supported (Split, ByteLevel, Metaspace, Sequence)");
  }
  return s;
}

void Tokenizer::Impl::read_pre_tokenizer(const json& j) {
  for (const auto& step : steps_of(present(j, "pre_tokenizer") ? j.at("pre_tokenizer") : json(), "pretokenizers")) {
    pre.push_back(pre_step(step));
    classes_by_regex |= pre.back().regex != nullptr;
  }
}

void Tokenizer::Impl::read_vocab(const json& model) {
  for (const auto& [token, id] : model.at("vocab").items()) {
    const int32_t i = token_id(id, token);
    vocab[token] = i;
    if (static_cast<size_t>(i) >= token_of.size()) token_of.resize(static_cast<size_t>(i) + 1);
    // Two tokens of one id: HF decodes the id as either, by its hash map's order.
    if (!token_of[static_cast<size_t>(i)].empty())
      fail("tokens '" + token_of[static_cast<size_t>(i)] + "' and '" + token + "' have the same id " +
           std::to_string(i));
    token_of[static_cast<size_t>(i)] = token;
    max_id = std::max(max_id, i);
  }
  if (present(model, "unk_token")) {
    auto u = vocab.find(model.at("unk_token").get<std::string>());
    if (u == vocab.end())
      fail("the unknown token '" + model.at("unk_token").get<std::string>() + "' is not in the vocabulary");
    unk = u->second;
  }
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    auto v = vocab.find(name);
    byte_id[b] = v == vocab.end() ? -1 : v->second;
  }
}

void Tokenizer::Impl::read_merges(const json& model) {
  int32_t rank = 0;
  for (const auto& merge : model.at("merges")) {
    std::string left, right;
    if (merge.is_array()) {
      left = merge.at(0).get<std::string>();
      right = merge.at(1).get<std::string>();
    } else {
      const std::string s = merge.get<std::string>();
      const auto space = s.find(' ');
      if (space == std::string::npos) fail("merge '" + s + "' is not 'left right'");
      left = s.substr(0, space);
      right = s.substr(space + 1);
    }
    auto l = vocab.find(left), r = vocab.find(right), lr = vocab.find(left + right);
    if (l == vocab.end() || r == vocab.end() || lr == vocab.end())
      fail("merge '" + left + " " + right + "' names a token that is not in the vocabulary");
    merges.emplace(pair_key(l->second, r->second), std::make_pair(rank++, lr->second));
  }
}

// What bpe() needs to cut a long piece: the characters that are tokens alone, the pairs of
// characters some vocabulary token holds side by side (every merge makes a vocabulary token, so no
// merge can join a pair outside this set), and whether any merge has a byte token as a side.
void Tokenizer::Impl::index_cuts() {
  for (const auto& [token, id] : vocab) {
    uint32_t before = 0;
    for (size_t i = 0, k = 0; i < token.size(); ++k) {
      const size_t n = std::min(utf8_length(static_cast<unsigned char>(token[i])), token.size() - i);
      const uint32_t cp = code_point(token, i, n);
      if (k > 0) joined.insert(uint64_t{before} << 32 | cp);
      if (n == token.size() && valid_utf8(token)) {  // as bpe() looks a character up
        if (cp >= alone.size()) alone.resize(std::max<size_t>(cp + 1, 0x80));
        alone[cp] = true;
      }
      before = cp;
      i += n;
    }
  }
  std::vector<bool> is_byte(static_cast<size_t>(max_id) + 1);
  for (const int32_t b : byte_id)
    if (b >= 0) is_byte[static_cast<size_t>(b)] = true;
  for (const auto& [key, rank_merged] : merges)
    bytes_merge |= is_byte[static_cast<size_t>(key >> 32)] || is_byte[static_cast<size_t>(key & 0xffffffffu)];
}

Tokenizer::Impl::DecStep Tokenizer::Impl::decoder_step(const json& step) const {
  const std::string t = step.value("type", "");
  DecStep s{};
  if (t == "ByteLevel") {
    s.kind = DecStep::byte_level;
  } else if (t == "Metaspace") {
    s.kind = DecStep::metaspace;
    s.from = step.at("replacement").get<std::string>();
    s.prepend = metaspace_scheme(step) != "never";
  } else if (t == "Replace") {
    s.kind = DecStep::replace;
    if (pattern_of(step.at("pattern"), s.from)) fail("a Replace decoder with a regex is not supported");
    s.to = step.at("content").get<std::string>();
  } else if (t == "ByteFallback") {
    s.kind = DecStep::byte_fallback;
  } else if (t == "Fuse") {
    s.kind = DecStep::fuse;
  } else if (t == "Strip") {
    s.kind = DecStep::strip;
    s.strip_content = step.at("content").get<std::string>();
    s.start = step.value("start", int64_t{0});
    s.stop = step.value("stop", int64_t{0});
  } else {
    fail("decoder '" + t + "' is not supported (ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip, Sequence)");
  }
  return s;
}

void Tokenizer::Impl::read_decoder(const json& j) {
  if (!present(j, "decoder")) return;
  has_decoder = true;
  for (const auto& step : steps_of(j.at("decoder"), "decoders")) decoder.push_back(decoder_step(step));
}

void Tokenizer::Impl::read_added_tokens(const json& j) {
  for (const auto& a : j.value("added_tokens", json::array())) {
    if (a.value("single_word", false))
      fail("added token '" + a.value("content", "") + "' uses single_word, which is not supported");
    Added t{a.at("content").get<std::string>(),
            "",
            token_id(a.at("id"), a.at("content").get<std::string>()),
            a.value("lstrip", false),
            a.value("rstrip", false),
            a.value("normalized", !a.value("special", false))};
    if (t.content.empty()) fail("an added token is empty");
    t.normalized_content = t.normalized ? normalize(t.content) : t.content;
    // HF decodes a normalized added token as its normalized content (what id_to_token gives).
    added_of[t.id] = t.normalized_content;
    max_id = std::max(max_id, t.id);
    added.push_back(std::move(t));
  }
  std::stable_sort(added.begin(), added.end(),
                   [](const Added& a, const Added& b) { return a.content.size() > b.content.size(); });
  for (const auto& a : added) {
    const std::string& key = a.normalized ? a.normalized_content : a.content;
    if (!key.empty()) (a.normalized ? normalized_added : raw_added).insert(key, &a);
  }
}

// The post-processor: the special tokens HF's encode(add_special_tokens=True) puts around one
// text. Read for encode_with_special_tokens; one that is not understood is named there.
void Tokenizer::Impl::read_post_processor(const json& j) {
  if (!present(j, "post_processor")) return;
  for (const auto& step : steps_of(j.at("post_processor"), "processors")) {
    const std::string t = step.value("type", "");
    if (t == "ByteLevel") continue;  // offsets only: no ids
    if (t != "TemplateProcessing") {
      post_unsupported = "post_processor '" + t + "'";
      continue;
    }
    bool after = false;
    for (const auto& piece : step.at("single")) {
      if (piece.contains("Sequence") && piece.at("Sequence").value("id", "") == "A" && !after) {
        after = true;
      } else if (piece.contains("SpecialToken")) {
        const std::string name = piece.at("SpecialToken").at("id").get<std::string>();
        for (const auto& id : step.at("special_tokens").at(name).at("ids"))
          (after ? special_suffix : special_prefix).push_back(token_id(id, name));
      } else {
        post_unsupported = "post_processor TemplateProcessing piece " + piece.dump();
      }
    }
  }
}

Tokenizer::Tokenizer(const std::string& path_in) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  const json j = m.open(path_in);
  try {
    if (!j.is_object()) m.fail("not a tokenizer.json object");
    m.read_model_options(j.at("model"));
    m.read_normalizer(j);
    m.read_pre_tokenizer(j);
    m.read_vocab(j.at("model"));
    m.read_merges(j.at("model"));
    m.index_cuts();
    m.read_decoder(j);
    m.read_added_tokens(j);  // after the normalizer: normalized tokens match normalized text
    m.read_post_processor(j);
    m.read_line_cuts();
    if (m.line_cuts == Impl::LineCuts::at_lines) m.probe_line_ends();
  } catch (const json::exception& e) {
    m.fail(std::string("malformed tokenizer.json: ") + e.what());
  }
}

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

std::vector<int32_t> Tokenizer::encode_with_special_tokens(const std::string& text) const {
  const Impl& m = *impl_;
  if (!m.post_unsupported.empty())
    throw RuntimeError(m.path + ": the " + m.post_unsupported +
                       " is not supported (ptrain reads TemplateProcessing and ByteLevel post-processors)");
  std::vector<int32_t> ids = m.special_prefix;
  const std::vector<int32_t> body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  ids.insert(ids.end(), m.special_suffix.begin(), m.special_suffix.end());
  return ids;
}

std::vector<int32_t> Tokenizer::encode(const std::string& text, bool text_start) const {
  const Impl& m = *impl_;
  if (!valid_utf8(text)) throw RuntimeError("text to tokenize is not valid UTF-8 (" + m.path + ")");
  if (m.classes_by_regex)
    for (size_t i = 0; i < text.size();) {
      const size_t n = utf8_length(static_cast<unsigned char>(text[i]));
      if (n > 1) {
        const std::string why = unicode_classes().check(code_point(text, i, n));
        if (!why.empty())
          throw UnclassifiedCharacter(why +
                                          ": the split regex could class it otherwise than HF tokenizers does, so it "
                                          "is refused rather than tokenized differently (" +
                                          m.path + ")",
                                      i);
      }
      i += n;
    }
  std::vector<int32_t> out;
  // Added tokens matched in the raw text split it; each stretch between them is normalized,
  // split again on the added tokens matched after normalization, and encoded.
  auto stretch = [&](const std::string& raw, bool at_start) {
    if (raw.empty()) return;
    try {
      const std::string norm = m.normalize(raw);
      size_t last = 0;
      for (const auto& hit : m.find_added(norm, true)) {
        m.encode_text(norm.substr(last, hit.begin - last), at_start && last == 0, out);
        out.push_back(hit.token->id);
        last = hit.end;
      }
      m.encode_text(norm.substr(last), at_start && last == 0, out);
    } catch (const RuntimeError& e) {  // a regex that failed or matched nothing: name the file too
      if (std::string(e.what()).find(m.path) != std::string::npos) throw;
      throw RuntimeError(std::string(e.what()) + " (" + m.path + ")");
    }
  };
  size_t last = 0;
  for (const auto& hit : m.find_added(text, false)) {
    stretch(text.substr(last, hit.begin - last), text_start && last == 0);
    out.push_back(hit.token->id);
    last = hit.end;
  }
  stretch(text.substr(last), text_start && last == 0);
  return out;
}

namespace {
// The decoder steps HF's decoders run over the list of token strings, one function each.

// ByteLevel: every token's characters back to bytes (a token with another character stays as
// written), then one text of them all.
std::vector<std::string> decode_byte_level(const std::vector<std::string>& tokens) {
  const ByteLevelMap& bl = byte_level();
  std::string bytes;
  for (const auto& t : tokens) {
    std::string b;
    bool all = true;
    for (size_t i = 0; i < t.size() && all;) {
      const size_t n = utf8_length(static_cast<unsigned char>(t[i]));
      auto hit = bl.byte_of.find(t.substr(i, n));
      if (hit == bl.byte_of.end())
        all = false;
      else
        b += static_cast<char>(hit->second);
      i += n;
    }
    bytes += all ? b : t;
  }
  return {lossy_utf8(bytes)};
}

// ByteFallback: runs of <0xNN> tokens to their text, or one U+FFFD per token where the run is
// not valid UTF-8.
std::vector<std::string> decode_byte_fallback(const std::vector<std::string>& tokens) {
  std::vector<std::string> next;
  std::string run;
  size_t run_tokens = 0;
  auto flush = [&] {
    if (!run_tokens) return;
    if (valid_utf8(run))
      next.push_back(run);
    else
      for (size_t k = 0; k < run_tokens; ++k) next.push_back("\xEF\xBF\xBD");
    run.clear();
    run_tokens = 0;
  };
  for (const auto& t : tokens) {
    if (t.size() == 6 && t.compare(0, 3, "<0x") == 0 && t[5] == '>' &&
        std::isxdigit(static_cast<unsigned char>(t[3])) && std::isxdigit(static_cast<unsigned char>(t[4]))) {
      run += static_cast<char>(std::stoul(t.substr(3, 2), nullptr, 16));
      ++run_tokens;
    } else {
      flush();
      next.push_back(t);
    }
  }
  flush();
  return next;
}

// Strip: up to `start` copies of the content from each token's start, `stop` from its end.
std::string strip_token(const std::string& t, const std::string& c, int64_t start, int64_t stop) {
  size_t b = 0, e = t.size();
  for (int64_t k = 0; k < start && t.compare(b, c.size(), c) == 0 && b + c.size() <= e; ++k) b += c.size();
  for (int64_t k = 0; k < stop && e >= b + c.size() && t.compare(e - c.size(), c.size(), c) == 0; ++k) e -= c.size();
  return t.substr(b, e - b);
}
}  // namespace

std::vector<std::string> Tokenizer::Impl::decode_step(const DecStep& step, const std::vector<std::string>& tokens) {
  std::vector<std::string> next;
  switch (step.kind) {
    case DecStep::byte_level:
      return decode_byte_level(tokens);
    case DecStep::byte_fallback:
      return decode_byte_fallback(tokens);
    case DecStep::metaspace:
      for (size_t i = 0; i < tokens.size(); ++i)
        next.push_back(replace_all(tokens[i], step.from, i == 0 && step.prepend ? "" : " "));
      break;
    case DecStep::replace:
      for (const auto& t : tokens) next.push_back(replace_all(t, step.from, step.to));
      break;
    case DecStep::fuse: {
      std::string all;
      for (const auto& t : tokens) all += t;
      next.push_back(all);
      break;
    }
    case DecStep::strip:
      for (const auto& t : tokens) next.push_back(strip_token(t, step.strip_content, step.start, step.stop));
      break;
  }
  return next;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  const Impl& m = *impl_;
  std::vector<std::string> tokens;
  for (int32_t id : ids) {
    auto a = m.added_of.find(id);
    if (a != m.added_of.end()) {
      tokens.push_back(a->second);
    } else if (id >= 0 && static_cast<size_t>(id) < m.token_of.size() && !m.token_of[static_cast<size_t>(id)].empty()) {
      tokens.push_back(m.token_of[static_cast<size_t>(id)]);
    } else {
      throw RuntimeError("token id " + std::to_string(id) + " is not in the vocabulary of " + m.path);
    }
  }
  if (!m.has_decoder) {  // HF joins the tokens with spaces
    std::string out;
    for (size_t i = 0; i < tokens.size(); ++i) out += (i ? " " : "") + tokens[i];
    return out;
  }
  for (const auto& step : m.decoder) tokens = Impl::decode_step(step, tokens);
  std::string out;
  for (const auto& t : tokens) out += t;
  return out;
}

std::optional<int32_t> Tokenizer::id_of(const std::string& token) const {
  for (const auto& a : impl_->added)
    if (a.content == token) return a.id;
  auto v = impl_->vocab.find(token);
  if (v != impl_->vocab.end()) return v->second;
  return std::nullopt;
}

std::optional<int32_t> Tokenizer::splitting_token(const std::string& text) const {
  for (const auto& a : impl_->added)
    if (a.content == text && !a.lstrip && !a.rstrip && !a.normalized) return a.id;
  return std::nullopt;
}

// How a text may be cut after a newline (Tokenizer::cuts_before): never where the normalizer or
// the pre-tokenizer puts something before every text (Prepend, Metaspace's prepend scheme
// "always"), a Replace could match across the cut (a regex, which may match anything; a string
// with a newline before its end), or an added token holds a newline before its end; after the
// runs of spaces a split regex parts alike (probe_line_ends); else, where nothing normalizes the
// text, where BPE may cut between the newline and the next character (Metaspace's scheme "first"
// prepends to the first part alone: the others are encoded as the text's continuation).
void Tokenizer::Impl::read_line_cuts() {
  bool split = false, normalizes = !normalizer.empty(), lstrip_normalized = false;
  auto spans_a_line = [](const std::string& s) {
    const auto nl = s.find('\n');
    return nl != std::string::npos && nl + 1 < s.size();
  };
  for (const auto& s : normalizer)
    if (s.kind == NormStep::prepend || (s.kind == NormStep::replace && (s.pattern || spans_a_line(s.text)))) return;
  for (const auto& s : pre) {
    if (s.kind == PreStep::metaspace && s.prepend == PreStep::always) return;
    split |= s.kind == PreStep::split || (s.kind == PreStep::byte_level && s.regex);
  }
  for (const auto& a : added) {
    if (spans_a_line(a.content) || spans_a_line(a.normalized_content)) return;
    lstrip_normalized |= a.lstrip && a.normalized;
  }
  if (split)
    line_cuts = LineCuts::at_lines;
  else if (!normalizes && !ignore_merges)
    line_cuts = LineCuts::where_bpe_may;
  if (normalizes && lstrip_normalized) line_cuts = LineCuts::never;  // it may match what the raw text does not
}

// The runs of spaces ending in a newline after which a tokenizer split by regexes may cut a text:
// those where every probe — a text, the run, a text — normalizes and pre-tokenizes to
// the same pieces whole as in two parts (so BPE, which merges inside a piece, gives the same ids).
// A regex may look past the run (GPT-2's \s+(?!\S) parts "\n\nx" as "\n", "\n", "x" but a text
// ending "\n\n" as one piece) or take the newline into the next piece (a made-up \s?\p{L}+): then
// that run, or every run, is no place to cut.
void Tokenizer::Impl::probe_line_ends() {
  static const char* const kRuns[] = {"\n", "\n\n", "\n\n\n", "\r\n", "\r\n\r\n", " \n", "  \n", "\t\n", " \n\n"};
  static const char* const kBefore[] = {"a", "Z", ".", "1", "}", "\u4e2d", "\u00e9", "the end", "x = 12"};
  static const char* const kAfter[] = {"a",   "Z",   "1",   ".",      "<",        "#",          "_",
                                       "-",   "(",   "'",   "\u4e2d", "\u00e9",   "\U0001F642", "the",
                                       "The", "123", "a.b", "'s",     "def f(x):"};
  for (const char* run : kRuns) {
    bool same = true;
    for (const char* before : kBefore)
      for (const char* after : kAfter) {
        const std::string head = std::string(before) + run;
        std::vector<std::string> parts = pre_tokenize(normalize(head), true);
        for (auto& p : pre_tokenize(normalize(after), false)) parts.push_back(std::move(p));
        same &= parts == pre_tokenize(normalize(head + after), true);
      }
    if (same) line_ends.emplace_back(run);
  }
}

bool Tokenizer::cuts_before(const std::string& text, size_t pos) const {
  const Impl& m = *impl_;
  auto is_space = [](char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\v' || c == '\f'; };
  if (m.line_cuts == Impl::LineCuts::never || pos >= text.size() || pos == 0 || text[pos - 1] != '\n' ||
      is_space(text[pos]))
    return false;
  // An added token with lstrip that starts here takes the newline before it.
  for (const auto* trie : {&m.raw_added, &m.normalized_added})
    if (const auto* hit = trie->longest(text, pos); hit && hit->lstrip) return false;
  if (m.line_cuts == Impl::LineCuts::at_lines) {  // the run of spaces before the cut, one a probe passed
    size_t run = pos - 1;
    while (run > 0 && pos - run < 8 && is_space(text[run - 1])) --run;
    if (run == 0 || is_space(text[run - 1])) return false;  // a longer run, or nothing before it
    return std::find(m.line_ends.begin(), m.line_ends.end(), text.substr(run, pos - run)) != m.line_ends.end();
  }
  const size_t n = std::min(utf8_length(static_cast<unsigned char>(text[pos])), text.size() - pos);
  const uint32_t cp = code_point(text, pos, n);
  return m.may_cut(m.edge(text, pos - 1, 1, '\n'), '\n', m.edge(text, pos, n, cp), cp);
}

namespace {

using Progress = std::function<void(int64_t, int64_t, int64_t)>;

// A JSONL record's "text" (a chat or prompt/completion record is refused: a token file has no
// loss mask).
std::string record_text(const std::string& record, const std::string& path, int64_t line) {
  try {
    const json j = json::parse(record);
    if (j.is_object() &&
        (j.contains("messages") || j.contains("prompt") || j.contains("conversations") || j.contains("instruction")))
      throw RuntimeError(path + ":" + std::to_string(line) +
                         ": a chat or prompt/completion record has a loss mask, which a token file cannot hold; "
                         "train on the JSONL file itself (data.format = \"jsonl\")");
    if (!j.is_object() || !j.contains("text") || !j.at("text").is_string())
      throw RuntimeError(path + ":" + std::to_string(line) + ": a JSONL record needs a string field \"text\"");
    return j.at("text").get<std::string>();
  } catch (const json::exception& e) {
    throw RuntimeError(path + ":" + std::to_string(line) + ": not valid JSON (" + e.what() + ")");
  }
}

// Chunks [begin, end) of `data` encoded by `threads` threads (`encode(k)`: chunk k's ids), joined
// in order; progress after each chunk, one call at a time. The first error stops the others.
std::vector<uint32_t> encode_chunks(const std::vector<std::pair<size_t, size_t>>& chunks, size_t total,
                                    const std::function<std::vector<uint32_t>(size_t)>& encode,
                                    const Progress& progress, int threads) {
  std::vector<std::vector<uint32_t>> ids(chunks.size());
  std::atomic<size_t> next{0};
  std::atomic<int64_t> bytes_done{0}, tokens_done{0};
  std::mutex report;
  std::exception_ptr error;
  auto work = [&] {
    try {
      for (size_t k; (k = next++) < chunks.size();) {
        ids[k] = encode(k);
        const int64_t b = bytes_done += static_cast<int64_t>(chunks[k].second - chunks[k].first);
        const int64_t t = tokens_done += static_cast<int64_t>(ids[k].size());
        if (progress) {
          std::lock_guard<std::mutex> lock(report);
          progress(b, static_cast<int64_t>(total), t);
        }
      }
    } catch (...) {
      std::lock_guard<std::mutex> lock(report);
      if (!error) error = std::current_exception();
      next = chunks.size();
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
  std::vector<uint32_t> out;
  out.reserve(static_cast<size_t>(tokens_done.load()));
  for (const auto& c : ids) out.insert(out.end(), c.begin(), c.end());
  return out;
}

// JSONL: each record's text, then end_of_document (when >= 0), record by record; chunks of about
// chunk_bytes whole lines, `threads` at a time (a record's ids do not depend on the others).
std::vector<uint32_t> tokenize_jsonl(const Tokenizer& tokenizer, const std::string& data, const std::string& path,
                                     int32_t end_of_document, const Progress& progress, size_t chunk_bytes,
                                     int threads) {
  std::vector<std::pair<size_t, size_t>> chunks;
  std::vector<int64_t> first_line;  // each chunk's first line number
  int64_t lines = 0;
  for (size_t pos = 0; pos < data.size();) {
    size_t end = pos;
    const int64_t first = lines + 1;
    while (end < data.size() && end - pos < std::max<size_t>(chunk_bytes, 1)) {
      const size_t nl = data.find('\n', end);
      end = nl == std::string::npos ? data.size() : nl + 1;
      ++lines;
    }
    chunks.emplace_back(pos, end);
    first_line.push_back(first);
    pos = end;
  }
  auto encode = [&](size_t k) {
    std::vector<uint32_t> out;
    int64_t line = first_line[k];
    for (size_t pos = chunks[k].first; pos < chunks[k].second; ++line) {
      size_t end = data.find('\n', pos);
      end = end == std::string::npos ? data.size() : end + 1;
      const std::string record = data.substr(pos, end - pos);
      if (record.find_first_not_of(" \t\r\n") != std::string::npos) {
        const std::vector<int32_t> ids = tokenizer.encode(record_text(record, path, line));
        out.insert(out.end(), ids.begin(), ids.end());
        if (end_of_document >= 0) out.push_back(static_cast<uint32_t>(end_of_document));
      }
      pos = end;
    }
    return out;
  };
  return encode_chunks(chunks, data.size(), encode, progress, threads);
}

// Plain text cut into chunks of about chunk_bytes after a newline where the tokenizer may cut
// (Tokenizer::cuts_before; one chunk where it may not): [begin, end) byte ranges.
std::vector<std::pair<size_t, size_t>> text_chunks(const Tokenizer& tokenizer, const std::string& data,
                                                   size_t chunk_bytes) {
  std::vector<std::pair<size_t, size_t>> chunks;
  for (size_t pos = 0; pos < data.size();) {
    size_t end = data.size();
    if (data.size() - pos > chunk_bytes)
      for (size_t i = pos + chunk_bytes; i + 1 < data.size(); ++i)
        if (data[i] == '\n' && tokenizer.cuts_before(data, i + 1)) {
          end = i + 1;
          break;
        }
    chunks.emplace_back(pos, end);
    pos = end;
  }
  return chunks;
}

// Plain text: the chunks encoded by `threads` threads, joined in order. A refused character is
// named by its line and byte in the file.
std::vector<uint32_t> tokenize_text(const Tokenizer& tokenizer, const std::string& data, const std::string& path,
                                    const Progress& progress, size_t chunk_bytes, int threads) {
  const std::vector<std::pair<size_t, size_t>> chunks = text_chunks(tokenizer, data, chunk_bytes);
  auto encode = [&](size_t k) {
    try {
      const std::vector<int32_t> ids =
          tokenizer.encode(data.substr(chunks[k].first, chunks[k].second - chunks[k].first), k == 0);
      return std::vector<uint32_t>(ids.begin(), ids.end());
    } catch (const UnclassifiedCharacter& e) {  // where it is in the file, not in the chunk
      const size_t at = chunks[k].first + e.byte;
      const auto line = 1 + std::count(data.begin(), data.begin() + static_cast<std::ptrdiff_t>(at), '\n');
      throw RuntimeError(path + ":" + std::to_string(line) + ": byte " + std::to_string(at) + " of the file: " + e.why);
    }
  };
  return encode_chunks(chunks, data.size(), encode, progress, threads);
}

}  // namespace

std::vector<uint32_t> tokenize_file(const Tokenizer& tokenizer, const std::string& path, bool jsonl,
                                    int32_t end_of_document, const Progress& progress, size_t chunk_bytes,
                                    int threads) {
  const std::string data = read_text_file(path);
  if (jsonl) return tokenize_jsonl(tokenizer, data, path, end_of_document, progress, chunk_bytes, threads);
  return tokenize_text(tokenizer, data, path, progress, chunk_bytes, threads);
}

int64_t Tokenizer::vocab_size() const { return static_cast<int64_t>(impl_->max_id) + 1; }
const std::string& Tokenizer::path() const { return impl_->path; }
const std::string& Tokenizer::reading() const { return impl_->reading; }
std::optional<std::pair<std::string, std::string>> Tokenizer::template_tokens() const { return impl_->template_tokens; }
const std::optional<std::string>& Tokenizer::embedded_chat_template() const { return impl_->embedded_chat_template; }
uint64_t Tokenizer::source_bytes() const { return impl_->source_bytes; }

}  // namespace ptrain
