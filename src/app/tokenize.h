// `ptrain tokenize`: text (or the {"text"} documents of a .jsonl file) to a token file —
// byte-level, or through an HF tokenizer.json — with progress and tokens/s.
#pragma once
#include <cstdint>
#include <string>

namespace ptrain {

struct TokenizeRequest {
  std::string in, out;       // --in TEXT|FILE.jsonl, --out FILE.bin
  std::string tokenizer;     // --tokenizer DIR|tokenizer.json ("" : byte-level)
  int64_t token_bytes = 0;   // --token-bytes 2|4 (0: 2, or 4 when the vocabulary needs it)
  int threads = 1;           // --threads N: text chunks encoded at once
  int64_t chunk_kib = 1024;  // --chunk-kib N: the size a text is cut into chunks at (where it may be cut)
};

int run_tokenize(const TokenizeRequest& request);  // the exit code

}  // namespace ptrain
