// The tokenizer of a GGUF file (its `tokenizer.ggml.*` metadata) as transformers' GGUF loader
// builds it (`AutoTokenizer.from_pretrained(dir, gguf_file=...)`, transformers 5.23): the
// tokenizer.json its backend then holds, which ptrain's tokenizer reads as written.
//   - `gpt2` (byte-level BPE: Llama 3, Qwen, SmolLM2, ...): the vocabulary spelled in GPT-2's byte
//     alphabet (a token with any other character respelled byte by byte), the file's merges, the
//     split regex named by `tokenizer.ggml.pre` where transformers knows the name (llama-bpe,
//     qwen2, tekken, gpt-4o, ...; else GPT-2's own), ByteLevel;
//   - `llama` (SentencePiece-style BPE: Llama 2, Mistral, TinyLlama): byte fallback, Metaspace
//     (prepend "first"), the file's merges or, where it has none, the merges its scores imply;
//     BOS added unless `tokenizer.ggml.add_bos_token` says otherwise;
// control tokens (type 3) and user-defined ones (type 4) as added tokens, special and not, the
// bos / eos / unk / pad ids' tokens as special ones, `add_bos_token` / `add_eos_token` as the
// post-processor. Other tokenizer models (t5, bert, rwkv, gemma4, ...), SentencePiece vocabularies
// of architectures transformers rebuilds its own way (gemma*, phi3) and anything malformed are
// refused naming the key (UnsupportedInput).
#pragma once
#include <cstdint>
#include <string>

namespace ptrain {

struct GgufTokenizer {
  std::string tokenizer_json;      // the tokenizer.json text
  std::string bos, eos, unk, pad;  // the special tokens as transformers resolves them ("" for None)
  bool add_bos = false, add_eos = false;
  std::string chat_template;  // tokenizer.chat_template ("" where the file has none)
  std::string description;    // how it was built, for the log
  uint64_t header_bytes = 0;  // the file's bytes it was built from (the header: no tensor data)
};

// The GGUF file whose tokenizer `path` names: `path` itself when it is a GGUF file (by its
// extension or its magic), the one *.gguf file of a directory without tokenizer.json; ""
// otherwise. Several GGUF files in such a directory are refused (UnsupportedInput): which one is
// the user's choice (gguf_reader.h gguf_file_at, as for model.hf_path).
std::string gguf_tokenizer_file(const std::string& path);

// `path`: a GGUF file. Throws UnsupportedInput / RuntimeError naming the file and the key.
GgufTokenizer read_gguf_tokenizer(const std::string& path);

// The split regex transformers' GGUF loader gives a `tokenizer.ggml.pre` name (nullptr for a name
// it does not know: GPT-2's own split).
const char* gguf_pre_tokenizer_split(const std::string& pre);

// The tokenizer as transformers' save_pretrained writes it into `dir`: tokenizer.json,
// tokenizer_config.json (TokenizersBackend, the special tokens, add_bos_token / add_eos_token)
// and chat_template.jinja — a directory transformers and ptrain read as the GGUF file's tokenizer.
void write_gguf_tokenizer_dir(const GgufTokenizer& t, const std::string& dir);

}  // namespace ptrain
