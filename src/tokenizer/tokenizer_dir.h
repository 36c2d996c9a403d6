// A model directory's tokenizer as transformers 5's AutoTokenizer builds it. transformers does
// not always run tokenizer.json as written: the class it resolves from tokenizer_config.json's
// `tokenizer_class` and config.json's `model_type` may rebuild the pipeline (LlamaTokenizer:
// Metaspace with a prepend scheme from `legacy` / `add_prefix_space`, no normalizer, its own
// decoder; Qwen2Tokenizer: NFC, Qwen's split regex, ByteLevel), and tokenizer_config.json (or,
// without its added_tokens_decoder, the legacy special_tokens_map.json and added_tokens.json) may
// name special tokens, or flags of added tokens, that tokenizer.json does not hold.
// read_tokenizer_dir() rewrites the parsed tokenizer.json into what transformers runs, or
// refuses — naming the file and key — whatever ptrain does not reproduce exactly: another
// tokenizer class, a special token transformers would add as a new token, added-token flags that
// differ from tokenizer.json's, `split_special_tokens`, remote code. A tokenizer_config.json key
// that transformers' code does not read is ignored, as transformers ignores it, and listed in the
// description.
#pragma once
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace ptrain {

struct TokenizerDirReading {
  // The class transformers uses ("TokenizersBackend": tokenizer.json as written;
  // "LlamaTokenizer", "Qwen2Tokenizer": pipeline rebuilt) and why, for the log.
  std::string description;
  // The tokenizer's bos_token / eos_token as transformers resolves them — what a chat template's
  // `bos_token` / `eos_token` render — "" for None.
  std::string bos_token, eos_token;
};

// `tokenizer`: the tokenizer file of DIR that hf_tokenizer_file() chose (`tokenizer_file`:
// tokenizer.json, or the one fast_tokenizer_files names) parsed; `tokenizer_text`: its text. Reads
// DIR/tokenizer_config.json, config.json, special_tokens_map.json and added_tokens.json when
// present. Throws RuntimeError.
TokenizerDirReading read_tokenizer_dir(const std::filesystem::path& dir, const std::filesystem::path& tokenizer_file,
                                       const std::string& tokenizer_text, nlohmann::json& tokenizer);

// The tokenizer_config.json keys ptrain knows transformers' code reads: implemented, refused at
// the values it does not reproduce, or read without an effect on ids and text. Every other key is
// ignored.
std::vector<std::string> tokenizer_config_keys_read();

}  // namespace ptrain
