// Training samples from conversations and prompt/completion pairs, as Llama 3 Instruct renders
// them, with the loss mask: which positions the model is trained to predict.
//
// Chat (Llama 3 Instruct's chat template): <|begin_of_text|>, then per message
// <|start_header_id|>ROLE<|end_header_id|>\n\n CONTENT (trimmed) <|eot_id|>. Only the assistant
// replies — their content and <|eot_id|> — are trained, unless train_on_prompt.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace ptrain {

class Tokenizer;

struct ChatMessage {
  std::string role;  // system, user, assistant, ipython
  std::string content;
};

struct Sample {
  std::vector<int32_t> ids;
  std::vector<uint8_t> trained;  // trained[t]: the loss includes predicting ids[t]
  // Next-token targets for inputs ids[0 .. n-2]: ids[t+1] where trained, else -100.
  std::vector<int64_t> targets() const;
};

// Throws RuntimeError for an unknown role, or a tokenizer without Llama 3's header tokens.
Sample render_chat(const Tokenizer& tokenizer, const std::vector<ChatMessage>& messages, bool train_on_prompt);

}  // namespace ptrain
