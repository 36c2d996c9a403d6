#include "data/sample_cache.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include <algorithm>
#include <bit>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <type_traits>
#include <vector>

#include "common/error.h"
#include "common/fs_util.h"
#include "data/rows.h"
#include "data/sample_writer.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;
using nlohmann::json;

static_assert(std::endian::native == std::endian::little, "the cache file is little-endian, as the host must be");

namespace {

constexpr char kMagic[8] = {'P', 'T', 'S', 'A', 'M', 'P', 'L', 'E'};
// Bumped whenever the layout changes or rendering changes what it makes of the same input.
// 2: stats hold reasoning_dropped; 3: chats with tools render (Qwen2.5); 4: with Llama 3.1 too, call_text_dropped
// 5: KTO's samples (flags 1 / 2: desirable or not), stats hold desirable / undesirable
// 6: text and prompt/completion records as TRL's SFTTrainer tokenizes them (the tokenizer's own
//    special tokens, eos_token appended, prompt + completion encoded whole)
constexpr uint32_t kCacheVersion = 6;

struct Trailer {
  char magic[8];
  uint32_t version;
  uint32_t crc32;  // of every byte before the trailer
  uint64_t key;
  int64_t samples, ids;
  int64_t trained_at, offsets_at, lines_at, counts_at, meta_at, meta_bytes;
  int64_t total_trained;
  int32_t max_id;
  uint32_t reserved;
  uint64_t content_hash;
};
static_assert(std::is_trivially_copyable_v<Trailer> && sizeof(Trailer) == 112);

int64_t align8(int64_t v) { return (v + 7) / 8 * 8; }

std::string sys_error(const std::string& what, const std::string& path) {
  return what + " '" + path + "': " + std::strerror(errno);
}

// CRC-32 of `n` bytes of `fd` from `at` (fewer at the end of the file).
uint32_t crc_of_range(int fd, int64_t at, int64_t n, const std::string& path) {
  std::vector<unsigned char> buf(static_cast<size_t>(n));
  const ssize_t got = ::pread(fd, buf.data(), buf.size(), at);
  if (got < 0) throw RuntimeError(sys_error("cannot read", path));
  return static_cast<uint32_t>(::crc32_z(0, buf.data(), static_cast<size_t>(got)));
}

uint64_t hash_text(uint64_t h, const std::string& s) {
  return hash_values(h, reinterpret_cast<const uint8_t*>(s.data()), static_cast<int64_t>(s.size()));
}

// What the samples depend on, as JSON (kept in the cache file, hashed into its key).
json key_parts(const std::string& data_path, DataFormat file_format, const Tokenizer& tok, const ChatFormat& format,
               const SampleOptions& o) {
  const std::string abs = fs::absolute(data_path).lexically_normal().string();
  const int fd = ::open(data_path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) throw RuntimeError(sys_error("cannot open", data_path));
  struct stat st {};
  ::fstat(fd, &st);
  const int64_t size = st.st_size, mib = int64_t{1} << 20;
  uint32_t head = 0, tail = 0;
  try {
    head = crc_of_range(fd, 0, mib, data_path);
    tail = crc_of_range(fd, std::max<int64_t>(0, size - mib), mib, data_path);
  } catch (...) {
    ::close(fd);
    throw;
  }
  ::close(fd);
  const FileSum tokenizer = file_sum(tok.path(), tok.source_bytes());
  json fields = json::array();
  for (const auto& [canonical, theirs] : o.fields) fields.push_back(canonical + "=" + theirs);
  return json{
      {"ptrain", PTRAIN_VERSION},
      {"cache_version", kCacheVersion},
      {"data",
       {{"path", abs},
        {"bytes", size},
        {"mtime_ns", static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec},
        {"crc32_first_mib", head},
        {"crc32_last_mib", tail}}},
      {"format", data_format_names().at(static_cast<size_t>(file_format))},
      {"tokenizer",
       {{"path", tok.path()}, {"reading", tok.reading()}, {"bytes", tokenizer.bytes}, {"crc32", tokenizer.crc32}}},
      {"chat",
       {{"template", chat_template_names()[static_cast<size_t>(format.kind)]},
        {"date", format.date},
        {"default_system", format.default_system},
        {"tools", format.tools}}},
      {"max_ids", o.max_ids},
      {"drop_too_long", o.drop_too_long},
      {"train_on_prompt", o.train_on_prompt},
      {"preference", o.preference},
      {"trl", {{"cpo", o.trl.cpo}, {"kto", o.trl.kto}, {"bos", o.trl.bos}, {"eos", o.trl.eos}}},
      {"skip_bad_records", o.skip_bad_records},
      {"fields", fields},
      {"ignore_fields", o.ignore_fields}};
}

json stats_json(const SampleStats& s) {
  return json{{"records", s.records},
              {"text", s.text},
              {"chat", s.chat},
              {"prompt_completion", s.prompt_completion},
              {"truncated", s.truncated},
              {"dropped_too_long", s.dropped_too_long},
              {"skipped_bad", s.skipped_bad},
              {"first_bad", s.first_bad},
              {"dropped_untrained", s.dropped_untrained},
              {"reasoning_dropped", s.reasoning_dropped},
              {"call_text_dropped", s.call_text_dropped},
              {"pairs", s.pairs},
              {"dropped_prompt_fills", s.dropped_prompt_fills},
              {"prompt_diverged", s.prompt_diverged},
              {"desirable", s.desirable},
              {"undesirable", s.undesirable}};
}

SampleStats stats_of(const json& j) {
  SampleStats s;
  s.records = j.at("records").get<int64_t>();
  s.text = j.at("text").get<int64_t>();
  s.chat = j.at("chat").get<int64_t>();
  s.prompt_completion = j.at("prompt_completion").get<int64_t>();
  s.truncated = j.at("truncated").get<int64_t>();
  s.dropped_too_long = j.at("dropped_too_long").get<int64_t>();
  s.skipped_bad = j.at("skipped_bad").get<int64_t>();
  s.first_bad = j.at("first_bad").get<std::string>();
  s.dropped_untrained = j.at("dropped_untrained").get<int64_t>();
  s.reasoning_dropped = j.at("reasoning_dropped").get<int64_t>();
  s.call_text_dropped = j.at("call_text_dropped").get<int64_t>();
  s.pairs = j.value("pairs", int64_t{0});
  s.dropped_prompt_fills = j.value("dropped_prompt_fills", int64_t{0});
  s.prompt_diverged = j.value("prompt_diverged", int64_t{0});
  s.desirable = j.value("desirable", int64_t{0});
  s.undesirable = j.value("undesirable", int64_t{0});
  return s;
}

// Streams ids into the cache file and the trained flags into an unnamed temporary beside it,
// appended after the ids when the data ends.
class CacheWriter final : public SampleWriter {
 public:
  struct Failed : RuntimeError {  // a write of the cache failed while the data was being rendered
    using RuntimeError::RuntimeError;
  };
  CacheWriter(const std::string& path) : out_(path) {
    std::string tmp = path + ".flags.XXXXXX";
    flags_ = ::mkstemp(tmp.data());
    if (flags_ < 0) throw RuntimeError(sys_error("cannot create", tmp));
    ::unlink(tmp.c_str());  // gone from the directory already: freed whatever happens to this process
  }
  ~CacheWriter() override { ::close(flags_); }

  // Appends the flags, the index, `meta` and the trailer, and renames the file into place.
  void finish(uint64_t key, const json& meta) {
    const int64_t ids = this->ids(), n = samples();
    if (::lseek(flags_, 0, SEEK_SET) != 0) throw RuntimeError("cannot rewind the cache's flag file");
    std::vector<unsigned char> buf(8 << 20);
    for (int64_t left = ids; left > 0;) {
      const ssize_t got = ::read(flags_, buf.data(), static_cast<size_t>(std::min<int64_t>(left, buf.size())));
      if (got <= 0) throw RuntimeError(std::string("cannot read back the cache's flag file: ") + std::strerror(errno));
      out_.write(buf.data(), static_cast<size_t>(got));
      left -= got;
    }
    Trailer t{};
    std::memcpy(t.magic, kMagic, sizeof kMagic);
    t.version = kCacheVersion;
    t.key = key;
    t.samples = n;
    t.ids = ids;
    t.trained_at = 4 * ids;
    t.offsets_at = align8(5 * ids);
    const std::vector<char> pad(static_cast<size_t>(t.offsets_at - 5 * ids), 0);
    out_.write(pad.data(), pad.size());
    out_.write(offsets_.data(), offsets_.size() * sizeof(int64_t));
    t.lines_at = t.offsets_at + 8 * (n + 1);
    out_.write(lines_.data(), lines_.size() * sizeof(int64_t));
    t.counts_at = t.lines_at + 8 * n;
    out_.write(counts_.data(), counts_.size() * sizeof(int64_t));
    t.meta_at = t.counts_at + 8 * n;
    const std::string text = meta.dump();
    t.meta_bytes = static_cast<int64_t>(text.size());
    out_.write(text.data(), text.size());
    t.total_trained = total_trained_;
    t.max_id = max_id_;
    t.content_hash = hash_;
    t.crc32 = out_.sum().crc32;
    out_.write(&t, sizeof t);
    out_.commit();
  }

 private:
  void store(const SampleBlock& b) override {
    try {
      write_block(b);
    } catch (const RuntimeError& e) {
      throw Failed(e.what());
    }
  }
  void write_block(const SampleBlock& b) {
    out_.write(b.ids.data(), b.ids.size() * sizeof(int32_t));
    const auto* p = b.trained.data();
    for (size_t left = b.trained.size(); left > 0;) {
      const ssize_t n = ::write(flags_, p, left);
      if (n < 0 && errno == EINTR) continue;
      if (n < 0) throw RuntimeError(std::string("cannot write the cache's flag file: ") + std::strerror(errno));
      p += n;
      left -= static_cast<size_t>(n);
    }
  }
  AtomicFile out_;
  int flags_ = -1;
};

class CacheReader final : public SampleWriter {
 public:
  // A verified mapping of `path` as a set, or the reason it is not usable.
  static std::optional<SampleSet> open(const SampleCacheKey& key, const std::string& source, bool verify_sum,
                                       std::string* why_not) {
    auto refuse = [&](const std::string& why) -> std::optional<SampleSet> {
      if (why_not) *why_not = key.path + ": " + why;
      return std::nullopt;
    };
    std::error_code ec;
    if (!fs::is_regular_file(key.path, ec)) return std::nullopt;
    auto map = std::make_shared<MappedFile>(key.path);
    const auto size = static_cast<int64_t>(map->size());
    if (size < static_cast<int64_t>(sizeof(Trailer))) return refuse("shorter than its trailer");
    Trailer t{};
    std::memcpy(&t, map->data() + size - static_cast<int64_t>(sizeof t), sizeof t);
    if (std::memcmp(t.magic, kMagic, sizeof kMagic) != 0) return refuse("not a ptrain sample cache");
    if (t.version != kCacheVersion) return refuse("cache version " + std::to_string(t.version));
    if (t.key != key.hash) return refuse("written for another key");
    const int64_t body = size - static_cast<int64_t>(sizeof t);
    const bool sizes_ok = t.samples >= 0 && t.ids >= 0 && t.ids <= body / 5 && t.samples <= body / 24 &&
                          t.trained_at == 4 * t.ids && t.offsets_at == align8(5 * t.ids) &&
                          t.lines_at == t.offsets_at + 8 * (t.samples + 1) &&
                          t.counts_at == t.lines_at + 8 * t.samples && t.meta_at == t.counts_at + 8 * t.samples &&
                          t.meta_bytes >= 0 && t.meta_at + t.meta_bytes == body;
    if (!sizes_ok) return refuse("its sizes do not add up to the file's " + std::to_string(size) + " bytes");
    if (verify_sum && file_sum(key.path, static_cast<uint64_t>(body)).crc32 != t.crc32)
      return refuse("checksum mismatch (a damaged file)");
    const unsigned char* base = map->data();
    const auto* offsets = reinterpret_cast<const int64_t*>(base + t.offsets_at);
    const auto* lines = reinterpret_cast<const int64_t*>(base + t.lines_at);
    const auto* counts = reinterpret_cast<const int64_t*>(base + t.counts_at);
    int64_t trained = 0;
    if (offsets[0] != 0 || offsets[t.samples] != t.ids) return refuse("its sample offsets do not span its ids");
    for (int64_t i = 0; i < t.samples; ++i) {
      const int64_t n = offsets[i + 1] - offsets[i];
      if (n < 2 || counts[i] < 1 || counts[i] > n - 1 || lines[i] < 1)
        return refuse("sample " + std::to_string(i) + "'s index is inconsistent");
      trained += counts[i];
    }
    if (trained != t.total_trained) return refuse("its trained-target counts do not add up");
    SampleStats stats;
    try {
      stats = stats_of(
          json::parse(std::string(reinterpret_cast<const char*>(base + t.meta_at), static_cast<size_t>(t.meta_bytes)))
              .at("stats"));
    } catch (const json::exception& e) {
      return refuse(std::string("its record of counts is unreadable (") + e.what() + ")");
    }
    const auto* ids = reinterpret_cast<const int32_t*>(base);
    const auto* flags = base + t.trained_at;
    return located(assemble(source, std::move(stats), map, ids, flags, offsets, lines, counts, t.samples,
                            t.total_trained, t.max_id, t.content_hash),
                   key.format);
  }
};

}  // namespace

std::string default_sample_cache_dir() {
  if (const char* d = std::getenv("PTRAIN_DATA_CACHE"); d && *d) return d;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) return std::string(x) + "/ptrain/datasets";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/ptrain/datasets";
  return ".ptrain_cache/datasets";
}

SampleCacheKey sample_cache_key(const std::string& dir, const std::string& data_path, DataFormat file_format,
                                const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o) {
  const std::string parts = key_parts(data_path, file_format, tok, format, o).dump();
  const uint64_t h = hash_text(0, parts);
  const std::string hex = hex_fingerprint("", h).substr(1);
  return {h, (fs::path(dir) / (fs::path(data_path).filename().string() + "." + hex + ".samples")).string(), parts,
          file_format};
}

std::optional<SampleSet> open_sample_cache(const SampleCacheKey& key, const std::string& data_path,
                                           std::string* why_not) {
  return CacheReader::open(key, data_path, /*verify_sum=*/true, why_not);
}

SampleSet build_sample_cache(const SampleCacheKey& key, const std::string& data_path, DataFormat file_format,
                             const Tokenizer& tok, const ChatFormat& format, const SampleOptions& o,
                             const SampleProgress& progress) {
  const std::string dir = fs::path(key.path).parent_path().string();
  const auto io = [&](const std::function<void()>& step) {
    try {
      step();
    } catch (const RuntimeError& e) {
      throw CacheWriteError(std::string(e.what()) + " (the sample cache in '" + dir +
                            "': data.cache_dir picks another directory, data.cache = false tokenizes into memory)");
    }
  };
  io([&] {
    std::error_code ec;
    fs::create_directories(dir, ec);
    if (ec) throw RuntimeError("cannot create '" + dir + "': " + ec.message());
  });
  std::unique_ptr<CacheWriter> w;
  io([&] { w = std::make_unique<CacheWriter>(key.path); });
  SampleStats stats;
  // A write failing inside rendering (a full disk) is the cache's problem; a bad record is the data's.
  try {
    stats = render_samples(data_path, file_format, tok, format, o, progress, *w);
  } catch (const CacheWriter::Failed& e) {
    io([&] { throw RuntimeError(e.what()); });
  }
  io([&] {
    w->finish(key.hash, json{{"source", data_path}, {"stats", stats_json(stats)}, {"key", json::parse(key.parts)}});
  });
  std::string why;
  std::optional<SampleSet> set = CacheReader::open(key, data_path, /*verify_sum=*/false, &why);
  if (!set) throw RuntimeError("the sample cache just written cannot be read back: " + why);
  return std::move(*set);
}

}  // namespace ptrain
