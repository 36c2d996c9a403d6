#include "app/tokenize.h"

#include <chrono>
#include <filesystem>

#include "common/error.h"
#include "common/fs_util.h"
#include "common/log.h"
#include "data/token_file.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

namespace ptrain {

namespace fs = std::filesystem;

int run_tokenize(const TokenizeRequest& a) {
  const std::string& in = a.in;
  const std::string& out = a.out;
  if (!fs::is_regular_file(in)) throw UsageError("no such input file '" + in + "'");
  if (a.tokenizer.empty()) {  // byte-level: each byte one token
    const int64_t width = a.token_bytes ? a.token_bytes : 2;
    if (width != 2 && width != 4) throw UsageError("--token-bytes must be 2 or 4");
    auto ids = byte_tokenize(read_text_file(in));
    write_token_file(out, ids, 256, static_cast<uint32_t>(width));
    log::info("wrote ", ids.size(), " byte-level tokens (vocab 256, ", width, " bytes each) to ", out);
    return 0;
  }
  const Tokenizer tok(a.tokenizer);
  log::info("tokenizer ", tok.path(), ": ", tok.reading());
  const int64_t width = a.token_bytes ? a.token_bytes : tok.vocab_size() > 65536 ? 4 : 2;
  if (width != 2 && width != 4) throw UsageError("--token-bytes must be 2 or 4");
  if (width == 2 && tok.vocab_size() > 65536)
    throw UsageError("the tokenizer has " + std::to_string(tok.vocab_size()) + " tokens; ids need --token-bytes 4");
  const bool jsonl = fs::path(in).extension() == ".jsonl";
  const std::string eod_token = jsonl ? document_markers(tok).second : std::string();
  const auto eod = eod_token.empty() ? std::nullopt : tok.splitting_token(eod_token);
  const auto t0 = std::chrono::steady_clock::now();
  auto seconds = [&] { return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(); };
  double last_report = 0;
  int64_t parts = 0;  // a text's chunks: the progress callback runs once after each
  auto ids = tokenize_file(
      tok, in, jsonl, eod ? *eod : -1,
      [&](int64_t done, int64_t total, int64_t tokens) {
        ++parts;
        const double s = seconds();
        if (s - last_report < 1.0 && done < total) return;
        last_report = s;
        log::info("tokenize: ", log::bytes(static_cast<double>(done)), " of ", log::bytes(static_cast<double>(total)),
                  " (",
                  log::fixed(100.0 * static_cast<double>(done) / static_cast<double>(std::max<int64_t>(total, 1)), 1),
                  "%), ", log::grouped(static_cast<double>(tokens)), " tokens, ",
                  log::grouped(static_cast<double>(tokens) / std::max(s, 1e-9)), " tokens/s");
      },
      static_cast<size_t>(a.chunk_kib) << 10, a.threads);
  const double s = seconds();
  write_token_file(out, ids, static_cast<uint32_t>(tok.vocab_size()), static_cast<uint32_t>(width));
  log::info("wrote ", log::grouped(static_cast<double>(ids.size())), " tokens (vocab ", tok.vocab_size(), ", ", width,
            " bytes each",
            jsonl   ? (eod ? ", " + eod_token + " after each document" : std::string(", no end-of-text token"))
            : parts ? ", the text in " + std::to_string(parts) + (parts == 1 ? " part" : " parts")
                    : "",
            ") to ", out, " in ", log::fixed(s, 2),
            " s: ", log::grouped(static_cast<double>(ids.size()) / std::max(s, 1e-9)), " tokens/s (wall clock, ",
            a.threads, a.threads == 1 ? " thread)" : " threads)");
  return 0;
}

}  // namespace ptrain
