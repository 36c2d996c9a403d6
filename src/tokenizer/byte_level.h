// GPT-2's byte-level alphabet (bytes_to_unicode): printable bytes stand for themselves, the other
// 68 are shifted to code points 256 and up, so every byte is one visible character. The
// ByteLevel pre-tokenizer and decoder use it, and GGUF's byte-level vocabularies are spelled in it.
#pragma once
#include <cstdint>
#include <string>
#include <unordered_map>

#include "common/utf8.h"

namespace ptrain {

struct ByteLevelMap {
  std::string of_byte[256];                          // the character (UTF-8) standing for each byte
  std::unordered_map<std::string, uint8_t> byte_of;  // and back
  ByteLevelMap() {
    uint32_t next = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174 && b <= 255);
      of_byte[b] = utf8(printable ? static_cast<uint32_t>(b) : next++);
      byte_of[of_byte[b]] = static_cast<uint8_t>(b);
    }
  }
};

inline const ByteLevelMap& byte_level() {
  static const ByteLevelMap b;
  return b;
}

}  // namespace ptrain
