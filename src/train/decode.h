// Decoding with a KV cache: continuing a prompt greedily or by sampling, and the ids generation
// stops at. `ptrain generate` (app/generate.h) and the trainer's sample prompts use it.
#pragma once
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace ptrain {

class FsdpModel;
class Tokenizer;
struct Config;
struct ChatFormat;

struct SamplingOptions {
  int64_t max_new_tokens = 256;
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: every token
  double top_p = 1.0;        // 1: every token
  uint64_t seed = 0;
  std::vector<std::string> stop;  // stop strings (the text up to the first one is kept)
};

struct Completion {
  std::vector<int32_t> ids;  // generated, the end-of-sequence token included when it ended there
  std::string text;          // their text, without the end-of-sequence token or a stop string
  std::string finish;        // "eos", "stop", "length" (max_new_tokens or the model's positions)
  int64_t prompt_tokens = 0;
  double prompt_seconds = 0, decode_seconds = 0;  // wall clock: the prompt's forward, then the rest
  int64_t cache_bytes = 0;                        // the KV cache's buffers
};

// Continues `prompt` (ids) with a KV cache of prompt + max_new_tokens positions; prompt and
// answer together stay within the model's max_seq_len positions. Each next token: greedy — the argmax of the logits,
// the first of equal maxima as torch.argmax — or sampled: logits / temperature, the top_k largest kept, then the most
// probable tokens whose probabilities first reach top_p, one drawn with a generator seeded by `seed` (the same seed
// draws the same tokens). Stops after an id in `eos`, at a stop string (needs `tokenizer`), or after max_new_tokens.
// `on_text`, when given with a tokenizer, receives each piece of text as it is decoded (whole UTF-8 characters). Throws
// UsageError for a prompt that fills the model's positions.
Completion complete(FsdpModel& model, const std::vector<int32_t>& prompt, const std::vector<int32_t>& eos,
                    const SamplingOptions& options, const Tokenizer* tokenizer,
                    const std::function<void(const std::string&)>& on_text = nullptr);

// The ids generation stops at: the model directory's generation_config.json eos_token_id (else
// config.json's), the tokenizer's end-of-document token and, with a chat format, its end of turn.
// A file that is not a JSON object, or an eos_token_id that is not a token id of the model (or a
// list of them), throws UnsupportedInput naming the file.
std::vector<int32_t> eos_ids(const Config& config, const Tokenizer* tokenizer, const ChatFormat* format);

// A model directory's generation_config.json may ask for sampling settings that transformers
// applies by default; ptrain decodes as its flags say, and warns naming the settings it leaves.
void warn_generation_settings_left(const Config& config, const SamplingOptions& options);

}  // namespace ptrain
