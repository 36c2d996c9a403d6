// Token files: a 32-byte little-endian header followed by a flat array of token ids.
//
//   offset  size  field
//        0     8  magic "PTRAINTK"
//        8     4  version (1)
//       12     4  token_bytes: 2 (uint16) or 4 (uint32)
//       16     8  count: number of tokens that follow
//       24     4  vocab_size: every token id is < vocab_size
//       28     4  reserved (0)
//       32     -  count * token_bytes bytes of token ids
//
// The file size must be exactly 32 + count * token_bytes; anything else is rejected.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

struct TokenFileHeader {
  uint32_t version = 1;
  uint32_t token_bytes = 2;
  uint64_t count = 0;
  uint32_t vocab_size = 0;
};

constexpr char kTokenMagic[8] = {'P', 'T', 'R', 'A', 'I', 'N', 'T', 'K'};
constexpr size_t kTokenHeaderBytes = 32;

// Reads and checks the header (magic, version, width, size). Throws RuntimeError naming the
// problem.
TokenFileHeader read_token_header(const std::string& path);

// Writes ids as a token file (atomically: temp file + rename). token_bytes is 2 or 4.
void write_token_file(const std::string& path, const std::vector<uint32_t>& ids, uint32_t vocab_size,
                      uint32_t token_bytes);

// Byte-level tokenizer: each byte of the text is one token (vocab 256).
std::vector<uint32_t> byte_tokenize(const std::string& text);

}  // namespace ptrain
