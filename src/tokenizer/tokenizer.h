// Hugging Face tokenizer.json for BPE models, as HF `tokenizers` runs it:
//   1. added tokens are matched in the raw text (leftmost-longest; `lstrip` / `rstrip` take the
//      whitespace beside them), those marked `normalized` in the normalized text;
//   2. the normalizer — NFC, NFD, NFKC, NFKD (utf8proc), Lowercase, Prepend, Replace (string or
//      regex), Sequence — on each stretch of text between added tokens;
//   3. the pre-tokenizer — Split(regex, Isolated) with PCRE2 and Unicode properties, ByteLevel
//      (the GPT-2 byte-to-character map, with or without GPT-2's own regex), Metaspace (`▁`
//      for spaces, prepend scheme, split), Sequence — into pieces;
//   4. BPE merges by rank on each piece's characters (a piece found whole in the vocabulary
//      first, with `ignore_merges`); a character outside the vocabulary becomes its UTF-8 bytes'
//      `<0xNN>` tokens (`byte_fallback`) or the unknown token (`fuse_unk` fusing runs of them).
// Decoding runs the decoder — ByteLevel, Metaspace, Replace, ByteFallback, Fuse, Strip,
// Sequence — over the tokens' strings, added tokens included. This covers Llama 3's byte-level
// BPE, Qwen2/2.5/3's (NFC, digits one by one) and the SentencePiece-style BPE of Llama 2,
// Mistral and TinyLlama; ids are identical to HF `tokenizers` (Tokenizer.* tests). Anything
// else — another model type, normalizer, pre-tokenizer or decoder, an option that changes them —
// is refused at load, naming it; never tokenized differently.
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "common/error.h"

namespace ptrain {

// Text holding a character the split regex's Unicode tables cannot class as HF tokenizers does:
// refused rather than tokenized differently. `byte`: where it starts in the text given to encode();
// `why`: the message without that offset, for a caller that names the place itself.
struct UnclassifiedCharacter : RuntimeError {
  UnclassifiedCharacter(const std::string& why, size_t byte)
      : RuntimeError("text to tokenize: byte " + std::to_string(byte) + ": " + why), byte(byte), why(why) {}
  size_t byte;
  std::string why;
};

class Tokenizer {
 public:
  // `path`: a tokenizer.json, read as HF tokenizers' Tokenizer.from_file reads it, or an HF model
  // directory holding one, read as transformers' AutoTokenizer reads it (tokenizer_config.json and
  // config.json decide the class, which may rebuild the pipeline: tokenizer/tokenizer_dir.h), or a
  // GGUF file (a directory holding one and no tokenizer.json) read as transformers' GGUF loader
  // reads it (tokenizer/gguf_tokenizer.h). Throws RuntimeError naming the file and what is
  // unsupported or malformed.
  explicit Tokenizer(const std::string& path);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;

  // Token ids of `text` (HF's encode with add_special_tokens=False: no BOS added); added
  // tokens written in the text (e.g. "<|eot_id|>") become their ids. Throws RuntimeError on
  // text that is not valid UTF-8 or a character the vocabulary cannot represent.
  // `text_start = false` encodes `text` as the continuation of a text after an added token
  // (Metaspace's "first" prepend scheme then adds nothing): how a chat template's pieces between
  // special tokens are encoded.
  std::vector<int32_t> encode(const std::string& text, bool text_start = true) const;
  // HF's encode(text) with add_special_tokens=True: encode() inside the special tokens the
  // tokenizer.json's post-processor adds (TemplateProcessing's single template, e.g. Llama 3's
  // <|begin_of_text|>; ByteLevel adds none). Throws RuntimeError naming a post-processor it
  // does not read.
  std::vector<int32_t> encode_with_special_tokens(const std::string& text) const;
  // The text of `ids` as HF's decode(skip_special_tokens=False) gives it; throws on an id
  // outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;
  // The id of a token as written ("<|eot_id|>", or a vocabulary entry), if it has one.
  std::optional<int32_t> id_of(const std::string& token) const;
  // An added token that `text` is exactly and that splits any text it appears in cleanly (no
  // lstrip / rstrip, matched on the raw text): its id.
  std::optional<int32_t> splitting_token(const std::string& text) const;
  int64_t vocab_size() const;  // largest id + 1
  const std::string& path() const;
  // How the tokenizer was read, for the log: a directory as transformers' AutoTokenizer reads it
  // (the class it resolves, and whether that class rebuilds tokenizer.json's pipeline), a file as
  // written.
  const std::string& reading() const;
  // For a model directory: {bos_token, eos_token} as transformers resolves them — what a chat
  // template's `bos_token` / `eos_token` render ("" for None); nullopt for a tokenizer.json file.
  std::optional<std::pair<std::string, std::string>> template_tokens() const;
  // For a GGUF file: its chat template (tokenizer.chat_template; "" where it has none), which
  // stands for a directory's chat_template.jinja / tokenizer_config.json; nullopt otherwise.
  const std::optional<std::string>& embedded_chat_template() const;
  // The leading bytes of path() the tokenizer is read from: the whole file, or a GGUF file's
  // header (its tensor data, gigabytes, is no part of the tokenizer) — what a cache keys on.
  uint64_t source_bytes() const;
  // Whether text may be cut at `pos`, after a newline that a non-space follows: encoding
  // text[0, pos) and then text[pos, end) as its continuation (encode(..., false)) gives the ids
  // of the whole. False where the normalizer or pre-tokenizer puts something before every text
  // (Prepend, Metaspace's scheme "always"), an added token could span the cut or take the
  // newline (lstrip), the split regexes part the run of spaces before it otherwise at a text's
  // end (probed when read), or — for a tokenizer no regex splits — a merge could join the sides.
  bool cuts_before(const std::string& text, size_t pos) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Tokenizes a corpus file: plain text, or JSONL with one {"text": "..."} document per line
// (each followed by `end_of_document` when >= 0), in chunks of about `chunk_bytes`, `threads`
// chunks at a time. Plain text is cut only where cuts_before() allows, so the ids equal encode()
// of the whole text (one chunk where it may not be cut); JSONL at line ends. `progress(bytes_done,
// bytes_total, tokens)` is called after each chunk (from the thread that finished it, one call at
// a time). A malformed JSONL line throws RuntimeError naming file:line.
std::vector<uint32_t> tokenize_file(const Tokenizer& tokenizer, const std::string& path, bool jsonl,
                                    int32_t end_of_document,
                                    const std::function<void(int64_t, int64_t, int64_t)>& progress,
                                    size_t chunk_bytes = 1 << 20, int threads = 1);

}  // namespace ptrain
