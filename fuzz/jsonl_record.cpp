// One JSONL record from a dataset downloaded from anywhere — text, chat messages, ShareGPT,
// Alpaca or prompt/completion, or a preference pair (rendered as a record and as a pair) —
// rendered with a real byte-level BPE tokenizer
// (tests/fixtures/hf_chat) in every chat template. A malformed record must be refused with an
// exception naming the problem; a crash, an out-of-bounds read or undefined behaviour is a finding.
#include <exception>
#include <memory>

#include "data/samples.h"
#include "tokenizer/chat.h"
#include "tokenizer/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const auto tok = std::make_unique<ptrain::Tokenizer>(PTRAIN_SOURCE_DIR "/tests/fixtures/hf_chat");
  static const auto formats = [] {
    std::vector<ptrain::ChatFormat> f;
    for (auto t : {ptrain::ChatTemplate::llama3, ptrain::ChatTemplate::llama3_1, ptrain::ChatTemplate::qwen2_5,
                   ptrain::ChatTemplate::qwen3, ptrain::ChatTemplate::chatml, ptrain::ChatTemplate::mistral,
                   ptrain::ChatTemplate::mistral_nemo}) {
      try {
        f.push_back(ptrain::chat_format(*tok, t));
      } catch (const std::exception&) {  // a template this tokenizer cannot render
      }
    }
    return f;
  }();
  const std::string line(reinterpret_cast<const char*>(data), size);
  for (const auto& format : formats)
    for (bool train_on_prompt : {false, true}) {
      try {
        ptrain::SampleStats stats;
        // text records with an eos_token, and without one (refused)
        (void)ptrain::render_record(*tok, format,
                                    ptrain::TrlTokenization{false, "", train_on_prompt ? "<|end_of_text|>" : ""}, line,
                                    train_on_prompt, stats);
      } catch (const std::exception&) {
      }
      // training.objective = "dpo" (with an eos_token and, for text pairs, without) and "simpo"
      for (const ptrain::TrlTokenization& how :
           {ptrain::TrlTokenization{false, "", train_on_prompt ? "<|eot_id|>" : ""},
            ptrain::TrlTokenization{true, train_on_prompt ? "<|begin_of_text|>" : "", "<|eot_id|>"}}) {
        try {
          (void)ptrain::render_preference(*tok, format, how, line);
        } catch (const std::exception&) {
        }
      }
      // training.objective = "kto": unpaired and paired records
      try {
        (void)ptrain::render_kto(*tok, format, {false, "", train_on_prompt ? "<|eot_id|>" : "", true}, line);
      } catch (const std::exception&) {
      }
    }
  return 0;
}
