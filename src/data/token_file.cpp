#include "data/token_file.h"

#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/error.h"
#include "common/fs_util.h"

namespace ptrain {

TokenFileHeader read_token_header(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RuntimeError("cannot open token file '" + path + "'");
  unsigned char buf[kTokenHeaderBytes];
  in.read(reinterpret_cast<char*>(buf), sizeof buf);
  if (in.gcount() != static_cast<std::streamsize>(sizeof buf))
    throw RuntimeError("token file '" + path + "' is shorter than its 32-byte header");
  if (std::memcmp(buf, kTokenMagic, 8) != 0)
    throw RuntimeError("'" + path + "' is not a ptrain token file (bad magic); convert text with `ptrain tokenize`");
  TokenFileHeader h;
  std::memcpy(&h.version, buf + 8, 4);
  std::memcpy(&h.token_bytes, buf + 12, 4);
  std::memcpy(&h.count, buf + 16, 8);
  std::memcpy(&h.vocab_size, buf + 24, 4);
  if (h.version != 1)
    throw RuntimeError("token file '" + path + "' has unsupported version " + std::to_string(h.version));
  if (h.token_bytes != 2 && h.token_bytes != 4)
    throw RuntimeError("token file '" + path + "' has token width " + std::to_string(h.token_bytes) +
                       " (must be 2 or 4)");
  if (h.token_bytes == 2 && h.vocab_size > 65536)
    throw RuntimeError("token file '" + path + "' stores uint16 ids but claims vocab_size " +
                       std::to_string(h.vocab_size));
  const uint64_t size = std::filesystem::file_size(path);
  if (h.count > (UINT64_MAX - kTokenHeaderBytes) / h.token_bytes || size != kTokenHeaderBytes + h.count * h.token_bytes)
    throw RuntimeError("token file '" + path + "' is truncated or corrupt: header says " + std::to_string(h.count) +
                       " tokens of " + std::to_string(h.token_bytes) + " bytes, file has " + std::to_string(size) +
                       " bytes");
  return h;
}

void write_token_file(const std::string& path, const std::vector<uint32_t>& ids, uint32_t vocab_size,
                      uint32_t token_bytes) {
  if (token_bytes != 2 && token_bytes != 4) throw UsageError("token width must be 2 or 4 bytes");
  if (token_bytes == 2 && vocab_size > 65536) throw UsageError("vocab_size > 65536 needs 4-byte tokens");
  std::vector<unsigned char> out(kTokenHeaderBytes + ids.size() * token_bytes, 0);
  const uint32_t version = 1;
  const uint64_t count = ids.size();
  std::memcpy(out.data(), kTokenMagic, 8);
  std::memcpy(out.data() + 8, &version, 4);
  std::memcpy(out.data() + 12, &token_bytes, 4);
  std::memcpy(out.data() + 16, &count, 8);
  std::memcpy(out.data() + 24, &vocab_size, 4);
  unsigned char* p = out.data() + kTokenHeaderBytes;
  for (uint32_t id : ids) {
    if (id >= vocab_size)
      throw UsageError("token id " + std::to_string(id) + " >= vocab_size " + std::to_string(vocab_size));
    if (token_bytes == 2) {
      const uint16_t v = static_cast<uint16_t>(id);
      std::memcpy(p, &v, 2);
    } else {
      std::memcpy(p, &id, 4);
    }
    p += token_bytes;
  }
  write_file_atomic(path, out.data(), out.size());
}

std::vector<uint32_t> byte_tokenize(const std::string& text) {
  std::vector<uint32_t> ids(text.size());
  for (size_t i = 0; i < text.size(); ++i) ids[i] = static_cast<unsigned char>(text[i]);
  return ids;
}

}  // namespace ptrain
