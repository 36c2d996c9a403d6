// `ptrain generate`: the model a config describes (HF weights, PEFT adapters, the NF4 base) or a
// ptrain checkpoint, answering prompts with a KV cache (train/decode.h), on one process.
#pragma once
#include <string>
#include <vector>

#include "train/decode.h"

namespace ptrain {

struct GenerateRequest {
  std::string config;
  std::vector<std::string> sets;
  std::string checkpoint;  // a step_N directory (any world size) instead of the config's weights
  std::string tokenizer;   // --tokenizer (default: data.tokenizer, else model.hf_path)
  std::string prompt;      // --prompt
  bool chat = false;       // --chat: the chat template; interactive without --prompt / --in
  std::string system;      // --system (chat)
  std::string in, out;     // --in prompts.jsonl --out answers.jsonl
  SamplingOptions sampling;
};
int run_generate(const GenerateRequest& request);  // the exit code

}  // namespace ptrain
