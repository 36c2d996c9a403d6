// Hugging Face tokenizer.json for byte-level BPE models (the Llama 3 / 3.1 / 3.2 family):
// added (special) tokens matched literally first, then the pre-tokenizer's Split regex
// (PCRE2 with Unicode properties), the byte-level mapping of each piece's UTF-8 bytes to
// printable characters, and BPE merges by rank (whole pieces found in the vocabulary first,
// as `ignore_merges` says). Decoding maps the byte-level characters back to bytes. Identical
// ids to HF `tokenizers` (Tokenizer.ParityWithHfTokenizers). Other tokenizer types
// (sentencepiece / Unigram / WordPiece, normalizers) are refused at load, naming the type.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace ptrain {

class Tokenizer {
 public:
  // `path`: a tokenizer.json, or a directory holding one (an HF model directory). Throws
  // RuntimeError naming the file and what is unsupported or malformed.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of `text`; added tokens written in the text (e.g. "<|eot_id|>") become their ids.
  std::vector<int32_t> encode(const std::string& text) const;
  // The text of `ids` (added tokens as written); throws on an id outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The id of a token as written ("<|eot_id|>", or a vocabulary entry), if it has one.
  std::optional<int32_t> id_of(const std::string& token) const;
  int64_t vocab_size() const;  // largest id + 1
  const std::string& path() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Tokenizes a corpus file: plain text, or JSONL with one {"text": "..."} document per line
// (each followed by `end_of_document` when >= 0). Plain text goes in chunks of about
// `chunk_bytes`, each cut after a newline that a non-space follows — where no pre-token can
// span the cut, so the ids equal encode() of the whole text. `progress(bytes_done, bytes_total,
// tokens)` is called after each chunk. A malformed JSONL line throws RuntimeError naming
// file:line.
std::vector<uint32_t> tokenize_file(const Tokenizer& tokenizer, const std::string& path, bool jsonl,
                                    int32_t end_of_document,
                                    const std::function<void(int64_t, int64_t, int64_t)>& progress,
                                    size_t chunk_bytes = 1 << 20);

}  // namespace ptrain
